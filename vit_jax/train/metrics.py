"""What a run reports: log lines, TensorBoard event files and WORKDIR/metrics.jsonl."""

import json
import time

import jax

from vit_jax import files, runtime
from vit_jax.progress import format_duration


class MetricWriter:
  """Writes scalars from process 0: TensorBoard under WORKDIR/tensorboard, JSON lines.

  `metrics.jsonl` gets one object per `write` call: `{"step", "split", ...}`.
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    self._jsonl_path = files.join(workdir, 'metrics.jsonl')
    self._summary_writer = None
    if self.enabled:
      files.makedirs(workdir)
      from vit_jax.data.tf_cpu import tf  # TensorFlow, kept off the accelerators.
      self._tf = tf
      self._summary_writer = tf.summary.create_file_writer(files.join(workdir, 'tensorboard'))

  def write(self, step: int, split: str, scalars: dict):
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    with files.open_file(self._jsonl_path, 'a') as f:
      f.write(json.dumps({'step': int(step), 'split': split, **scalars}) + '\n')
    with self._summary_writer.as_default(step=int(step)):
      for name, value in scalars.items():
        self._tf.summary.scalar(f'{split}/{name}', value)
    self._summary_writer.flush()

  def close(self):
    if self._summary_writer is not None:
      self._summary_writer.close()


def read_rows(workdir: str) -> list[dict]:
  """The objects of WORKDIR/metrics.jsonl, in order; [] when there is none."""
  path = files.join(workdir, 'metrics.jsonl')
  if not files.exists(path):
    return []
  return [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]


class Progress:
  """For log lines: examples/s, ETA, the share of time spent on data, resident memory."""

  def __init__(self, start_step: int, total_steps: int, batch_size: int):
    self.total_steps, self.batch_size = total_steps, batch_size
    self._start_time = self._last_time = time.perf_counter()
    self._start_step = self._last_step = start_step
    self.data_wait = 0.0  # Seconds spent waiting for input since the last report.
    self.total_data_wait = 0.0

  def add_data_wait(self, seconds: float):
    self.data_wait += seconds
    self.total_data_wait += seconds

  def report(self, step: int) -> dict:
    now = time.perf_counter()
    elapsed = max(now - self._last_time, 1e-9)
    steps = step - self._last_step
    rate = steps / elapsed
    remaining = (self.total_steps - step) / rate if rate else float('inf')
    resident, peak = runtime.resident_bytes()
    stats = {'examples_per_sec': steps * self.batch_size / elapsed,
             'data_wait_fraction': self.data_wait / elapsed, 'eta': remaining,
             'peak_resident_bytes': peak}
    if resident is not None:
      stats['resident_bytes'] = resident
    self._last_time, self._last_step, self.data_wait = now, step, 0.0
    return stats

  def summary(self) -> str:
    wall = time.perf_counter() - self._start_time
    return (f'{self._last_step - self._start_step} steps in {format_duration(wall)}; '
            f'waiting for data {100 * self.total_data_wait / max(wall, 1e-9):.1f}% '
            'of the wall time')

