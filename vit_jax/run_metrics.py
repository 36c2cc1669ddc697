"""Reading a run's WORKDIR/metrics.jsonl: one JSON object per line, `{"step", "split", ...}`.

  rows = run_metrics.read_rows(workdir)  # [{'step': 10, 'split': 'train', 'loss': ...}, ...]
  series = run_metrics.read_series(workdir)  # {'train': {'loss': (steps, values), ...}, ...}

The trainer writes it (`vit_jax.train.metrics.MetricWriter`); plots and tests read it here.
Workdirs may be remote (gs://...), as everywhere in vit_jax.
"""

import json

import numpy as np

from vit_jax import errors, files

FILE_NAME = 'metrics.jsonl'


def parse_rows(lines) -> list[dict]:
  """The rows of metrics.jsonl's lines, in order, without a line cut short (a killed process,
  a full disk) that does not parse."""
  rows = []
  for line in lines:
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(row, dict) and 'step' in row and 'split' in row:
      rows.append(row)
  return rows


def _rows_in(path: str) -> list[dict] | None:
  """The rows of the metrics file at `path`, or None when there is none."""
  return parse_rows(files.read_text(path).splitlines()) if files.exists(path) else None


def read_rows(workdir: str) -> list[dict]:
  """The rows of WORKDIR/metrics.jsonl, in order; [] when there is none."""
  return _rows_in(files.join(str(workdir), FILE_NAME)) or []


def read_series(path: str) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
  """WORKDIR/metrics.jsonl (or the workdir) -> {split: {metric: (steps, values)}}.

  A step logged twice (a resumed run logs the steps after its checkpoint again) counts once,
  with its last values.
  """
  path = str(path)
  if not path.endswith('.jsonl') or files.isdir(path):
    path = files.join(path, FILE_NAME)
  rows = _rows_in(path)
  if rows is None:
    raise errors.MissingFileError(f'No metrics at {path}: pass the workdir of a vit_jax run that '
                                  'has logged at least once.')
  last = {}  # (split, step) -> the last row logged for it.
  for row in rows:
    last[row.pop('split'), row.pop('step')] = row
  series: dict[str, dict[str, list[tuple[int, float]]]] = {}
  for (split, step), row in sorted(last.items(), key=lambda item: item[0][1]):
    for name, value in row.items():
      series.setdefault(split, {}).setdefault(name, []).append((step, value))
  return {split: {name: tuple(np.array(column) for column in zip(*points))
                  for name, points in metrics.items()}
          for split, metrics in series.items()}
