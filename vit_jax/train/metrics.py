"""What a run reports: log lines, TensorBoard event files and WORKDIR/metrics.jsonl (read by
`vit_jax.run_metrics`)."""

import json
import os
import socket
import time

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer import record_writer

from vit_jax import files, run_metrics, runtime
from vit_jax.progress import format_duration


class _EventFile:
  """A TensorBoard event file (records of `Event` protos), written without TensorFlow."""

  def __init__(self, directory: str):
    files.makedirs(directory)
    name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0'
    self.path = files.join(directory, name)
    self._file = files.open_file(self.path, 'wb')
    self._records = record_writer.RecordWriter(self._file)
    self._write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))

  def _write(self, event):
    self._records.write(event.SerializeToString())

  def scalars(self, step: int, values: dict[str, float]):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)
                                         for tag, value in values.items()])
    self._write(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    self._file.flush()

  def close(self):
    self._file.close()


class MetricWriter:
  """Writes scalars from process 0: TensorBoard under WORKDIR/tensorboard, JSON lines.

  `metrics.jsonl` gets one object per `write` call: `{"step", "split", ...}`.
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    self._jsonl_path = files.join(workdir, run_metrics.FILE_NAME)
    self._events = None
    if self.enabled:
      files.makedirs(workdir)
      self._events = _EventFile(files.join(workdir, 'tensorboard'))

  def write(self, step: int, split: str, scalars: dict):
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    path = self._jsonl_path
    with files.full_disk_as_one_line(path), files.open_file(path, 'a') as f:
      f.write(json.dumps({'step': int(step), 'split': split, **scalars}) + '\n')
    with files.full_disk_as_one_line(self._events.path):
      self._events.scalars(int(step), {f'{split}/{name}': v for name, v in scalars.items()})

  def close(self):
    if self._events is not None:
      self._events.close()


def figures(results: dict) -> str:
  """An evaluation's figures for its log line: `accuracy 0.9722  loss 0.1234  num_examples 360`
  (counts, `num_*`, as whole numbers)."""
  return '  '.join(f'{name} {value:.0f}' if name.startswith('num_') else f'{name} {value:.4f}'
                   for name, value in results.items())


def memory_text(stats: dict) -> str:
  """'memory 1.23 GB (peak 1.40 GB)': the process's resident memory, for progress lines."""
  now = stats.get('resident_bytes')
  now = '?' if now is None else f'{now / 1e9:.2f}'
  return f'memory {now} GB (peak {stats["peak_resident_bytes"] / 1e9:.2f} GB)'


def keep_rows_until(workdir: str, step: int):
  """Drops WORKDIR/metrics.jsonl's rows after `step` (and lines cut short), as a run resumed
  from the checkpoint of `step` logs those steps again (process 0)."""
  path = files.join(workdir, run_metrics.FILE_NAME)
  if jax.process_index() != 0 or not files.exists(path):
    return
  lines = files.read_text(path).splitlines()
  rows = [row for row in run_metrics.parse_rows(lines) if row['step'] <= step]
  if len(rows) != len(lines):
    files.write_text_atomically(path, ''.join(json.dumps(row) + '\n' for row in rows))


class Progress:
  """For log lines: examples/s, ETA, the share of time spent on data, resident memory.

  The rates are of training time: what `exclude` is told of (evaluations, saves) is left out
  of the window it falls in, and counts only in `summary`'s wall time.
  """

  def __init__(self, start_step: int, total_steps: int, batch_size: int):
    self.total_steps, self.batch_size = total_steps, batch_size
    self._start_time = self._last_time = time.perf_counter()
    self._start_step = self._last_step = start_step
    self.data_wait = 0.0  # Seconds spent waiting for input since the last report.
    self.total_data_wait = 0.0
    self._excluded = 0.0  # Seconds of evaluation and saving since the last report.

  def add_data_wait(self, seconds: float):
    self.data_wait += seconds
    self.total_data_wait += seconds

  def exclude(self, seconds: float):
    """`seconds` since the last report that were not training (an evaluation, a save)."""
    self._excluded += seconds

  def report(self, step: int) -> dict:
    now = time.perf_counter()
    elapsed = max(now - self._last_time - self._excluded, 1e-9)
    steps = step - self._last_step
    rate = steps / elapsed
    remaining = (self.total_steps - step) / rate if rate else float('inf')
    resident, peak = runtime.resident_bytes()
    stats = {'examples_per_sec': steps * self.batch_size / elapsed,
             'data_wait_fraction': self.data_wait / elapsed, 'eta': remaining,
             'peak_resident_bytes': peak}
    if resident is not None:
      stats['resident_bytes'] = resident
    self._last_time, self._last_step, self.data_wait, self._excluded = now, step, 0.0, 0.0
    return stats

  def summary(self) -> str:
    wall = time.perf_counter() - self._start_time
    return (f'{self._last_step - self._start_step} steps in {format_duration(wall)}; '
            f'waiting for data {100 * self.total_data_wait / max(wall, 1e-9):.1f}% '
            'of the wall time')

