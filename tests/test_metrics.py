"""Progress figures of the log lines: rates, and the process's resident memory."""

import numpy as np

from vit_jax import runtime
from vit_jax.train import loop, metrics


def test_reports_carry_resident_memory_now_and_at_its_peak():
  progress = metrics.Progress(start_step=0, total_steps=10, batch_size=4)
  held = np.ones(64 * 2**20 // 8)  # 64 MiB, touched: resident while held.
  stats = progress.report(step=2)
  assert stats['examples_per_sec'] > 0
  assert held.nbytes <= stats['resident_bytes'] <= stats['peak_resident_bytes']
  assert stats['peak_resident_bytes'] == runtime.resident_bytes()[1]
  line = loop._memory({'resident_bytes': 1.5e9, 'peak_resident_bytes': 2.25e9})
  assert line == 'memory 1.50 GB (peak 2.25 GB)'
  assert loop._memory({'peak_resident_bytes': 2e9}) == 'memory ? GB (peak 2.00 GB)'
