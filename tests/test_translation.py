"""The translation trainer: dates end to end, translate from a file, own parallel text."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import override, read_metrics

from vit_jax import decode, errors, main, progress, visualize
from vit_jax.data import text
from vit_jax.train import checkpointing, translation
from vit_jax.train import config as config_lib


def tiny_config(**overrides):
  config = config_lib.translation_config('Transformer-testing')
  config.model.embed_dim = 64
  config.model.mlp_dim = 128
  config.model.dropout_rate = 0.0
  config.data.dataset = 'dates'
  config.data.tokenizer = 'chars'
  config.data.max_length = 40
  config.data.dates_train_size = 2000
  config.data.dates_test_size = 50
  config.batch_size = 32
  config.eval_batch_size = 32
  config.total_steps = 20
  config.optimizer.name = 'adamw'
  config.optimizer.schedule = 'constant'
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 0
  config.beam_size = 1
  config.log_every = 10
  config.eval_every = 0
  config.checkpoint_every = 0
  return override(config, overrides)


def test_dates_train_evaluate_and_translate(tmp_path, capsys, monkeypatch):
  workdir = str(tmp_path / 'dates')
  results = main.run(tiny_config(), workdir)
  assert {'loss', 'token_accuracy', 'bleu', 'exact_match'} <= set(results)
  row = read_metrics(workdir, 'test')[-1]
  assert row['step'] == 20 and 0 <= row['exact_match'] <= 1 and row['bleu'] >= 0
  losses = [row['loss'] for row in read_metrics(workdir, 'train')]
  assert losses[-1] < losses[0]
  figure = visualize.plot_training_curves(workdir)  # Not the speed, counts or memory.
  assert [ax.get_ylabel() for ax in figure.axes] == [
      'loss', 'bleu', 'exact match', 'token accuracy', 'learning rate']
  visualize.save_figure(figure, str(tmp_path / 'curves.png'))

  inputs = tmp_path / 'inputs.txt'
  inputs.write_text('le 3 mars 1979\n\n3. März 1979\n')
  capsys.readouterr()
  outputs = main.run(tiny_config(trainer='translate', input_file=str(inputs)), workdir)
  assert len(outputs) == 3 and outputs[1] == ''  # One line out per line in, empty ones empty.
  assert capsys.readouterr().out.splitlines() == outputs
  # Lines are read as the corpus's are: a byte order mark, CR and surrounding spaces go.
  inputs.write_bytes('\ufeffle 3 mars 1979\r\n  le 3 mars 1979 \n'.encode('utf-8'))
  assert main.run(tiny_config(trainer='translate', input_file=str(inputs)),
                  workdir) == [outputs[0]] * 2
  inputs.write_text('le 3 mars 1979\n' + 'x' * 50 + '\n')  # Over max_length=40 tokens.
  capsys.readouterr()
  outputs = main.run(tiny_config(trainer='translate', input_file=str(inputs)), workdir)
  captured = capsys.readouterr()
  assert captured.out.splitlines() == outputs  # Translations only: the note is on stderr.
  assert 'Note: 1 line(s) (line 2) have more than 39 tokens: only their start' in captured.err
  monkeypatch.setattr(progress, 'SLOW_SECONDS', 0.0)  # The progress lines of a quick decode.
  inputs.write_text('le 3 mars 1979\n')
  main.run(tiny_config(trainer='translate', input_file=str(inputs)), workdir)
  assert re.search(r'^Decoding 1 sentence \(greedy\): 1 of 1 sentence in [\d.]+s\.$',
                   capsys.readouterr().err, re.M)
  monkeypatch.undo()
  with pytest.raises(errors.MissingFileError, match=r"config\.input_file: file '\S+' does not"):
    main.run(tiny_config(trainer='translate', input_file=str(tmp_path / 'missing.txt')), workdir)

  # trainer=visualize: one cross-attention heat map per sentence, and the training curves.
  paths = main.run(tiny_config(trainer='visualize', **{
      'visualize.inputs': 'le 3 mars 1979|3. März 1979'}), workdir)
  assert sorted(os.path.relpath(p, workdir) for p in paths) == [
      'visualize/cross_attention_0.png', 'visualize/cross_attention_1.png',
      'visualize/training_curves.png']

  # Another model's config is refused in one line, before anything is decoded.
  for mode in ('translate', 'visualize'):
    with pytest.raises(errors.ConfigError, match=r'The checkpoint at step 20 in \S+ was written '
                       r'by a model of another shape \(\d+ mismatched parameters, first: .*'
                       r'model \(96,\).*\)\. Use the config that wrote it: leave out '
                       r'--config'):
      main.run(tiny_config(trainer=mode, input_file=str(inputs),
                           **{'model.embed_dim': 96}), workdir)


def test_beam_search_evaluation(tmp_path, monkeypatch):
  # With beam_size=3, evaluation decodes by beam search: the outputs it scores, and so its
  # BLEU and exact match, are the best beams of the trained model (its checkpoint, decoded
  # independently here), and greedy decoding of the same model gives other outputs and
  # another BLEU, so a Translator that fell back to greedy (or used another width) fails.
  scored = []  # The (hypotheses, references) evaluation scores; the real metrics still run.
  text_metrics = translation.text_metrics
  monkeypatch.setattr(translation, 'text_metrics',
                      lambda h, r: scored.append((list(h), list(r))) or text_metrics(h, r))
  config = tiny_config(beam_size=3, total_steps=10)
  workdir = str(tmp_path / 'beam')
  results = main.run(config, workdir)
  data = text.build(config.data, workdir=workdir)
  sources, references = zip(*data.eval_texts())
  params, step = checkpointing.restore_params(workdir)
  assert step == 10 and results['num_decoded'] == len(sources) == 50
  model = config_lib.build_model(config.model, vocab_size=data.tokenizer.vocab_size)
  # One batch of decode_batch_size rows, padded as the Translator pads them.
  padding = [''] * (config.decode_batch_size - len(sources))
  inputs = translation.encode_lines(data.tokenizer, list(sources) + padding,
                                    config.data.max_length)
  length = config.data.max_length
  beams, scores = jax.jit(lambda p, x: decode.beam_search(
      model, p, x, max_length=length, beam_size=3,
      alpha=config.length_penalty_alpha))(params, inputs)
  greedy = jax.jit(lambda p, x: decode.greedy_decode(model, p, x, max_length=length))(
      params, inputs)
  assert beams.shape == (config.decode_batch_size, 3, length)
  assert np.all(np.diff(np.asarray(scores), axis=1) <= 1e-6)  # Best beam first.

  def texts(rows):
    rows = np.asarray(rows)[:len(sources)]
    return [data.tokenizer.decode([int(t) for t in row]) for row in rows]

  beam_texts, greedy_texts = texts(beams[:, 0]), texts(greedy)
  assert scored == [(beam_texts, list(references))]
  assert sum(b != g for b, g in zip(beam_texts, greedy_texts)) >= 10
  beam_metrics = text_metrics(beam_texts, list(references))
  greedy_metrics = text_metrics(greedy_texts, list(references))
  assert results['bleu'] == pytest.approx(beam_metrics['bleu'], rel=1e-6)
  assert results['exact_match'] == beam_metrics['exact_match']
  assert results['bleu'] != pytest.approx(greedy_metrics['bleu'], rel=1e-3)


def test_translate_without_a_trained_tokenizer_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='tokenizer'):
    main.run(tiny_config(trainer='translate', input_file=os.devnull), str(tmp_path / 'empty'))


def _write_corpus(directory, pairs):
  source, target = directory / 'train.src', directory / 'train.tgt'
  source.write_text(''.join(s + '\n' for s, _ in pairs), encoding='utf-8')
  target.write_text(''.join(t + '\n' for _, t in pairs), encoding='utf-8')
  return f'{source},{target}'


def test_own_parallel_text_bleu_rises(tmp_path):
  numbers = ['one', 'two', 'three', 'four', 'five', 'six']
  german = ['eins', 'zwei', 'drei', 'vier', 'fünf', 'sechs']
  pairs = [(f'{numbers[a]} and {numbers[b]} make', f'{german[a]} und {german[b]} ergeben')
           for a in range(6) for b in range(6)]
  files = _write_corpus(tmp_path, pairs)
  workdir = str(tmp_path / 'mt')
  results = main.run(tiny_config(**{
      'data.dataset': 'files', 'data.train_files': files, 'data.eval_files': files,
      'data.tokenizer': 'bytes', 'total_steps': 100, 'log_every': 50, 'eval_every': 20,
      'optimizer.learning_rate': 5e-3}), workdir)
  evals = read_metrics(workdir, 'test')
  assert [row['step'] for row in evals] == [20, 40, 60, 80, 100]
  first, last = evals[0], evals[-1]
  assert results['bleu'] == pytest.approx(last['bleu'])
  # 20 steps in, the model has learnt little (BLEU ~4, no exact translation); 100 steps
  # of the 36 pairs translate (nearly) all of them exactly, which no untrained model does.
  assert last['bleu'] > 90 and last['bleu'] > first['bleu'] + 50, evals
  assert last['exact_match'] >= 0.9 and last['exact_match'] > first['exact_match'] + 0.5, evals
  assert last['token_accuracy'] > 0.98 and last['loss'] < first['loss'] / 2, evals


def test_mismatched_line_counts_name_both_counts(tmp_path):
  source, target = tmp_path / 'a.src', tmp_path / 'a.tgt'
  source.write_text('one\ntwo\nthree\n')
  target.write_text('eins\nzwei\n')
  with pytest.raises(ValueError, match=r'3 .*2|2 .*3'):
    main.run(tiny_config(**{'data.dataset': 'files', 'data.train_files': f'{source},{target}',
                            'data.eval_files': f'{source},{target}'}), str(tmp_path / 'w'))


def test_accumulated_step_equals_the_whole_batch_step_with_uneven_microbatches(tmp_path):
  """Microbatches count by their target tokens, not equally."""
  import optax  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  task = translation.TranslationTask(tiny_config(), str(tmp_path))
  params = jax.jit(task.init_params)(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  length = task.config.data.max_length
  inputs = rng.integers(3, 20, (4, length)).astype(np.int32)
  targets = rng.integers(3, 20, (4, length)).astype(np.int32)
  targets[0::2, 2:] = 0  # Microbatch 0 (rows 0 and 2): 2 target tokens a row; microbatch 1: 40.
  batch = {'inputs': inputs, 'targets': targets}
  tx = optax.sgd(1.0)
  state = {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': tx.init(params),
           'rng': jax.random.PRNGKey(1)}
  results = {accum: jax.jit(loop.make_train_step(task, tx, lambda step: 1.0, accum))(
      state, batch, None) for accum in (1, 2)}
  (whole, whole_metrics), (accumulated, accumulated_metrics) = results[1], results[2]
  np.testing.assert_allclose(accumulated_metrics['loss'], whole_metrics['loss'], rtol=1e-5)
  np.testing.assert_allclose(accumulated_metrics['token_accuracy'],
                             whole_metrics['token_accuracy'], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(accumulated_metrics['grad_norm'], whole_metrics['grad_norm'],
                             rtol=1e-4)
  for a, b in zip(jax.tree.leaves(accumulated['params']), jax.tree.leaves(whole['params'])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # The two microbatches' own mean losses differ, so weighing them equally would not match.
  halves = [task.loss(params, {k: v[i::2] for k, v in batch.items()}, jax.random.PRNGKey(2),
                      None)[0] for i in (0, 1)]
  assert abs(float(np.mean(halves)) - float(whole_metrics['loss'])) > 1e-3, halves
