"""Reading WORKDIR/metrics.jsonl: rows in order, series by split, resumed runs, cut lines."""

import json

import pytest

from vit_jax import run_metrics


def _write(path, rows, tail=''):
  path.write_text(''.join(json.dumps(row) + '\n' for row in rows) + tail)


def test_rows_in_order_without_a_line_cut_short_or_a_foreign_one(tmp_path):
  rows = [{'step': 10, 'split': 'train', 'loss': 3.0}, {'step': 10, 'split': 'test', 'loss': 2.0}]
  _write(tmp_path / 'metrics.jsonl', rows[:1] + [['not', 'a', 'row'], {'step': 5}] + rows[1:],
         tail='{"step": 20, "spl')
  assert run_metrics.read_rows(tmp_path) == rows
  assert run_metrics.read_rows(tmp_path / 'no_run_here') == []


def test_series_count_each_step_once_with_its_last_values(tmp_path):
  # A run resumed from step 10 logged step 10 again (2.5); the test split's rows are apart.
  _write(tmp_path / 'metrics.jsonl',
         [{'step': 10, 'split': 'train', 'loss': 3.0, 'learning_rate': 1e-3},
          {'step': 20, 'split': 'train', 'loss': 2.0, 'learning_rate': 5e-4},
          {'step': 10, 'split': 'train', 'loss': 2.5, 'learning_rate': 1e-3},
          {'step': 20, 'split': 'test', 'loss': 1.0, 'accuracy': 0.7}], tail='{"step": 30, "spl')
  for path in (tmp_path, tmp_path / 'metrics.jsonl'):  # The workdir or the file.
    series = run_metrics.read_series(str(path))
    steps, losses = series['train']['loss']
    assert steps.tolist() == [10, 20] and losses.tolist() == [2.5, 2.0]
    assert series['train']['learning_rate'][1].tolist() == [1e-3, 5e-4]
    assert {name: values.tolist() for name, (_, values) in series['test'].items()} == {
        'loss': [1.0], 'accuracy': [0.7]}


def test_a_workdir_without_metrics_is_one_line(tmp_path):
  with pytest.raises(FileNotFoundError,
                     match=r'^No metrics at \S+/metrics\.jsonl: pass the workdir of a vit_jax run'):
    run_metrics.read_series(str(tmp_path))
