"""Greedy translation exported from a dates workdir: the same tokens as trainer=translate."""

import json
import os

import jax
import numpy as np
import pytest
from helpers import REPO, override

from vit_jax import errors, main
from vit_jax.data import text, vocabulary
from vit_jax.export import __main__ as cli
from vit_jax.export import export
from vit_jax.train import config as config_lib, translation

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('export_translation')

NUM_DATES = 100


@pytest.fixture(scope='module')
def dates(tmp_path_factory):
  """A dates workdir after 80 steps of batch 16, and 100 of its test dates. Its answers need
  not be right, only repeatable and varied: were every answer the same, an export that
  ignored its input would match too."""
  workdir = str(tmp_path_factory.mktemp('dates') / 'run')
  config = config_lib.from_file(str(REPO / 'configs/transformer_dates.py'))
  config = override(config, {'total_steps': 80, 'batch_size': 16,
                             'data.dates_train_size': 512, 'data.dates_test_size': NUM_DATES,
                             'eval_every': 0, 'checkpoint_every': 0, 'log_every': 10,
                             'num_eval_decode': 4, 'decode_batch_size': 32})
  main.run(config, workdir)
  sources = [source for source, _ in text.build(config.data, workdir=workdir).eval_texts()]
  assert len(sources) == NUM_DATES
  input_file = os.path.join(os.path.dirname(workdir), 'dates.txt')
  with open(input_file, 'w', encoding='utf-8') as f:
    f.write('\n'.join(sources) + '\n')
  translated = main.run(override(config, {'trainer': 'translate', 'input_file': input_file}),
                        workdir)  # What trainer=translate prints, line by line.
  return {'workdir': workdir, 'config': config, 'sources': sources, 'translated': translated}


def _inputs(dates, sources):
  config = dates['config']
  tokenizer = vocabulary.load_tokenizer(config.data, dates['workdir'])
  return tokenizer, translation.encode_lines(tokenizer, sources, config.data.max_length)


def _tokens(artifact: str, export_format: str, inputs: np.ndarray) -> np.ndarray:
  if export_format == 'stablehlo':  # As a client runs it: no vit_jax model code.
    with open(os.path.join(artifact, 'model.stablehlo'), 'rb') as f:
      exported = jax.export.deserialize(bytearray(f.read()))
    return np.asarray(exported.call(inputs)['tokens'])
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  serve = tf.saved_model.load(artifact).signatures['serving_default']
  return serve(inputs=tf.constant(inputs))['tokens'].numpy()


@pytest.mark.parametrize('export_format', ['stablehlo', 'savedmodel'])
def test_exported_greedy_translation_equals_trainer_translate(dates, tmp_path, export_format):
  artifact = str(tmp_path / export_format)
  metadata = export(dates['workdir'], artifact, export_format)
  tokenizer, inputs = _inputs(dates, dates['sources'])
  assert metadata['inputs'][0]['shape'] == ['b', inputs.shape[1]]
  assert os.path.exists(os.path.join(artifact, metadata['tokenizer_file']))
  assert json.load(open(os.path.join(artifact, 'metadata.json')))['decoding'] == 'greedy'
  tokens = _tokens(artifact, export_format, inputs)  # All 100 dates in one batch.
  decoded = [tokenizer.decode([int(t) for t in row]) for row in tokens]
  assert decoded == dates['translated']
  assert len(set(decoded)) > NUM_DATES // 4  # Answers that differ, which a match must follow.
  # The same file at another batch size gives the same tokens.
  config = dates['config']
  from vit_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  model = config_lib.build_model(config.model, vocab_size=tokenizer.vocab_size)
  params, _ = checkpointing.restore_params(dates['workdir'])
  _, expected = translation.Translator(model, params, tokenizer, config).translate_ids(
      dates['sources'][:7])
  np.testing.assert_array_equal(_tokens(artifact, export_format, inputs[:7]), expected)
  np.testing.assert_array_equal(tokens[:7], expected)
  print(f'{export_format}: {NUM_DATES} dates, exported tokens equal trainer=translate\'s; '
        f'e.g. {dates["sources"][0]!r} -> {decoded[0]!r}')


def test_options_of_image_classifiers_are_errors_for_a_translation_workdir(dates, tmp_path,
                                                                          capsys):
  out = str(tmp_path / 'x')
  for argv, message in (
      (['--format', 'onnx'], 'a translation workdir exports as stablehlo or savedmodel'),
      (['--format', 'stablehlo', '--preprocess'], '--preprocess applies to image classifiers'),
      (['--format', 'stablehlo', '--pixel-mean', '0.5'],
       '--pixel-mean applies to image classifiers'),
      (['--format', 'stablehlo', '--eval-interpolation', 'bicubic'],
       '--eval-resize/-interpolation/-resize-ratio applies to image classifiers')):
    assert cli.main([dates['workdir'], out, *argv]) == 1
    assert message in capsys.readouterr().err
    assert not os.path.exists(out)
  with pytest.raises(errors.ConfigError, match='has no EMA weights'):
    export(dates['workdir'], out, 'stablehlo', ema=True)
  assert not os.path.exists(out)
