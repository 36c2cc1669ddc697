"""Progress figures of the log lines: rates, and the process's resident memory."""

import json

import numpy as np

from vit_jax import run_metrics, runtime
from vit_jax.train import metrics


def test_reports_carry_resident_memory_now_and_at_its_peak():
  progress = metrics.Progress(start_step=0, total_steps=10, batch_size=4)
  held = np.ones(64 * 2**20 // 8)  # 64 MiB, touched: resident while held.
  stats = progress.report(step=2)
  assert stats['examples_per_sec'] > 0
  assert held.nbytes <= stats['resident_bytes'] <= stats['peak_resident_bytes']
  assert stats['peak_resident_bytes'] == runtime.resident_bytes()[1]
  line = metrics.memory_text({'resident_bytes': 1.5e9, 'peak_resident_bytes': 2.25e9})
  assert line == 'memory 1.50 GB (peak 2.25 GB)'
  assert metrics.memory_text({'peak_resident_bytes': 2e9}) == 'memory ? GB (peak 2.00 GB)'


def test_evaluation_and_saving_time_is_left_out_of_the_rates(monkeypatch):
  clock = iter([0.0, 10.0, 30.0, 40.0])  # Start, report at step 2, report at step 4, summary.
  monkeypatch.setattr(metrics.time, 'perf_counter', lambda: next(clock))
  progress = metrics.Progress(start_step=0, total_steps=10, batch_size=4)
  progress.add_data_wait(1.0)
  assert progress.report(step=2)['examples_per_sec'] == 8 / 10
  progress.exclude(15.0)  # An evaluation after step 2: 20 s between reports, 5 s of training.
  progress.add_data_wait(1.0)
  stats = progress.report(step=4)
  assert stats['examples_per_sec'] == 8 / 5 and stats['data_wait_fraction'] == 1 / 5
  assert stats['eta'] == 6 / (2 / 5)
  assert progress.summary() == '4 steps in 0m40s; waiting for data 5.0% of the wall time'


def test_tensorboard_reads_the_scalars_which_are_written_without_tensorflow(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ('import sys\n'
          'from vit_jax.train import metrics\n'
          f'writer = metrics.MetricWriter({str(tmp_path)!r})\n'
          "writer.write(3, 'train', {'loss': 1.5, 'accuracy': 0.25})\n"
          "writer.write(6, 'train', {'loss': 0.5, 'accuracy': 0.75})\n"
          'writer.close()\n'
          'assert "tensorflow" not in sys.modules, "tensorflow was imported"\n')
  subprocess.run([sys.executable, '-c', code], check=True)
  from tensorboard.backend.event_processing import (  # pylint: disable=g-import-not-at-top
      event_accumulator)
  events = event_accumulator.EventAccumulator(str(tmp_path / 'tensorboard'))
  events.Reload()
  assert sorted(events.Tags()['scalars']) == ['train/accuracy', 'train/loss']
  assert [(e.step, e.value) for e in events.Scalars('train/loss')] == [(3, 1.5), (6, 0.5)]
  assert [row['loss'] for row in run_metrics.read_rows(str(tmp_path))] == [1.5, 0.5]


def test_a_resumed_run_drops_the_rows_it_logs_again_and_a_line_cut_short(tmp_path):
  rows = [{'step': s, 'split': 'train', 'loss': 1.0 / s} for s in (10, 20, 30)]
  text = ''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 40, "split": "tr'
  (tmp_path / 'metrics.jsonl').write_text(text)
  assert run_metrics.read_rows(tmp_path) == rows
  metrics.keep_rows_until(str(tmp_path), 20)
  assert run_metrics.read_rows(tmp_path) == rows[:2]
  assert (tmp_path / 'metrics.jsonl').read_text().count('\n') == 2


def test_an_evaluations_figures_give_counts_as_whole_numbers():
  assert metrics.figures({'accuracy': 0.97222, 'loss': 0.1, 'num_examples': 360.0,
                          'num_decoded': 16.0}) == (
                              'accuracy 0.9722  loss 0.1000  num_examples 360  num_decoded 16')
