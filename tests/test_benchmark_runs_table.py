"""`python -m vit_jax.benchmark.runs_table`: benchmark reports and training runs in one table."""

import json

import pytest

from vit_jax.benchmark import runs_table

_ARGS = {'model': 'ViT-B_16', 'mode': 'train', 'batch': 128, 'dtype': 'bfloat16',
         'attention': 'auto', 'matmul': 'auto', 'xla_option': [], 'timing': 'pipelined'}


def _vit_report(images_per_s, **args):
  return {'args': {**_ARGS, **args}, 'device': {'platform': 'gpu'}, 'ours': {
      'images_per_s': images_per_s, 'mfu': 0.323, 'memory': {'device_peak_bytes': 3 * 2**30}}}


def test_training_run_figures_weight_each_line_by_its_steps(tmp_path):
  workdir = tmp_path / 'trainer_b128'
  workdir.mkdir()
  lines = [  # The first line holds the compilation and is left out.
      {'step': 10, 'split': 'train', 'examples_per_sec': 5.0, 'data_wait_fraction': 0.5},
      {'step': 20, 'split': 'train', 'examples_per_sec': 100.0, 'data_wait_fraction': 0.0},
      {'step': 50, 'split': 'train', 'examples_per_sec': 300.0, 'data_wait_fraction': 0.1},
      {'step': 50, 'split': 'test', 'accuracy': 0.1},
  ]
  # A trainer stopped by a time limit while it wrote its last line.
  (workdir / 'metrics.jsonl').write_text(''.join(json.dumps(line) + '\n' for line in lines)
                                         + '{"step": 60, "split": "tr')
  (workdir / 'config.json').write_text(json.dumps(
      {'batch_size': 128, 'model': {'name': 'ViT-B_16', 'dtype': 'bfloat16'}}))
  row = runs_table.rows_of(str(workdir / 'metrics.jsonl'))[0]
  # 10 steps at 100/s and 30 steps at 300/s (per example-unit): 40 / (0.1 + 0.1) = 200.
  assert row['per_s'] == pytest.approx(200.0)
  assert row['data_wait'] == pytest.approx(0.1 * 0.1 / 0.2)
  assert row['what'] == 'ViT-B_16 trainer b128 bfloat16, steps 11-50, data wait 5.0%'


def test_table_names_options_peers_and_the_trainer_against_the_benchmark(tmp_path, capsys):
  base = tmp_path / 'b128.json'
  base.write_text(json.dumps({**_vit_report(3000.0), 'ratio_images_per_s_ours_over_timm': 1.21}))
  flags = tmp_path / 'b128_lhs.json'
  flags.write_text(json.dumps(_vit_report(
      3300.0, xla_option=['xla_gpu_enable_latency_hiding_scheduler=true'],
      optimizer_state_dtype='bfloat16')))
  seq2seq = tmp_path / 'transformer.json'
  seq2seq.write_text(json.dumps({
      'args': {**_ARGS, 'model': 'Transformer-base', 'mode': 'seq2seq'},
      'device': {'platform': 'gpu'},
      'memory': {'device_peak_bytes': 2**30},
      'train': {'tokens_per_s': 250000.0, 'mfu': 0.4},
      'decode_cached': {'tokens_per_s': 9000.0, 'mfu': None},
      'torch_train': {'tokens_per_s': 200000.0},
      'ours_over_torch_train_tokens_per_s': 1.25}))
  run = tmp_path / 'trainer'
  run.mkdir()
  (run / 'metrics.jsonl').write_text(''.join(json.dumps(
      {'step': s, 'split': 'train', 'examples_per_sec': 2940.0, 'data_wait_fraction': 0.0}) + '\n'
      for s in (50, 100)))
  assert runs_table.main([str(base), str(flags), str(seq2seq), str(run / 'metrics.jsonl'),
                          str(tmp_path / 'never_written.json'), '--against', str(base)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].split() == ['run', 'what', 'ran', 'per', 'second', 'MFU', 'peak', 'GiB',
                              'vs', 'peer', 'vs', 'benchmark']
  assert lines[1].split()[-6:] == ['3,000', 'images/s', '32.3%', '3.0', '1.21', '-']
  assert ('(optimizer_state_dtype bfloat16, xla_gpu_enable_latency_hiding_scheduler=true)'
          in lines[2])
  assert lines[3].split()[:2] == ['transformer', 'train'] and '1.25' in lines[3]
  assert lines[4].split()[:2] == ['transformer', 'decode_cached']
  assert lines[5].split()[0] == 'trainer' and lines[5].split()[-1] == '0.980'
  assert lines[6] == f'missing (the run that writes them failed or did not run): ' \
                     f'{tmp_path / "never_written.json"}'


def test_timing_is_named_where_it_is_not_autos_choice():
  what = lambda report: runs_table.report_rows('r.json', report)[0]['what']  # noqa: E731
  report = _vit_report(3000.0)
  assert what(report) == 'ViT-B_16 train b128 bfloat16'  # Pipelined on a GPU.
  report['args']['timing'] = 'isolated'
  assert what(report) == 'ViT-B_16 train b128 bfloat16 (timing isolated)'
  report['device']['platform'] = 'cpu'
  assert what(report) == 'ViT-B_16 train b128 bfloat16'
  del report['args']['timing']  # A report from before --timing: isolated steps.
  report['device']['platform'] = 'gpu'
  assert what(report) == 'ViT-B_16 train b128 bfloat16 (timing isolated)'


def test_a_file_of_another_kind_is_a_one_line_error(tmp_path, capsys):
  other = tmp_path / 'config.json'
  other.write_text(json.dumps({'batch_size': 8}))
  assert runs_table.main([str(other)]) == 1
  assert capsys.readouterr().out == (f'error: {other} is neither a benchmark --json report nor '
                                     "a metrics.jsonl (it has no 'args').\n")
