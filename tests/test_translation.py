"""The translation trainer: dates end to end, translate from a file, own parallel text."""

import os

import pytest
from helpers import override, read_metrics

from vit_jax import main
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


def test_dates_train_evaluate_and_translate(tmp_path, capsys):
  workdir = str(tmp_path / 'dates')
  results = main.run(tiny_config(), workdir)
  assert {'loss', 'token_accuracy', 'bleu', 'exact_match'} <= set(results)
  row = read_metrics(workdir, 'test')[-1]
  assert row['step'] == 20 and 0 <= row['exact_match'] <= 1 and row['bleu'] >= 0
  losses = [row['loss'] for row in read_metrics(workdir, 'train')]
  assert losses[-1] < losses[0]

  inputs = tmp_path / 'inputs.txt'
  inputs.write_text('le 3 mars 1979\n\n3. März 1979\n')
  capsys.readouterr()
  outputs = main.run(tiny_config(trainer='translate', input_file=str(inputs)), workdir)
  assert len(outputs) == 3  # One line out per line in, empty ones included.
  assert capsys.readouterr().out.splitlines() == outputs

  # trainer=visualize: one cross-attention heat map per sentence, and the training curves.
  paths = main.run(tiny_config(trainer='visualize', **{
      'visualize.inputs': 'le 3 mars 1979|3. März 1979'}), workdir)
  assert sorted(os.path.relpath(p, workdir) for p in paths) == [
      'visualize/cross_attention_0.png', 'visualize/cross_attention_1.png',
      'visualize/training_curves.png']


def test_beam_search_evaluation(tmp_path):
  results = main.run(tiny_config(beam_size=3, total_steps=10), str(tmp_path / 'beam'))
  assert 0 <= results['exact_match'] <= 1


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
      'data.tokenizer': 'bytes', 'total_steps': 150, 'log_every': 50, 'eval_every': 150,
      'optimizer.learning_rate': 5e-3}), workdir)
  assert results['bleu'] > 30, results


def test_mismatched_line_counts_name_both_counts(tmp_path):
  source, target = tmp_path / 'a.src', tmp_path / 'a.tgt'
  source.write_text('one\ntwo\nthree\n')
  target.write_text('eins\nzwei\n')
  with pytest.raises(ValueError, match=r'3 .*2|2 .*3'):
    main.run(tiny_config(**{'data.dataset': 'files', 'data.train_files': f'{source},{target}',
                            'data.eval_files': f'{source},{target}'}), str(tmp_path / 'w'))
