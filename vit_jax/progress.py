"""What a run tells its user while it works: log lines, long phases, progress counts.

Printed on process 0 only (every process computes the same numbers), to stdout.
"""

import contextlib
import time
from typing import Iterator

import jax

TICK_SECONDS = 10.0  # Least time between two progress lines of one phase.


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{seconds:02d}s'


def log(message: str):
  """Prints `message` on process 0."""
  if jax.process_index() == 0:
    print(message, flush=True)


class Phase:
  """A long piece of work: says when it starts, how far it is, and when it ends."""

  def __init__(self, description: str, total: int | None = None, unit: str = ''):
    self.description, self.total, self.unit = description, total, unit
    self.done = 0
    self.result = ''  # Said at the end, e.g. 'read 29,000 pairs'.
    self._start = self._last_tick = time.perf_counter()

  def _count(self) -> str:
    total = f' of {self.total:,}' if self.total is not None else ''
    return f'{self.done:,}{total} {self.unit}'.rstrip()

  def advance(self, count: int = 1):
    """Counts `count` more done; prints a progress line at most every TICK_SECONDS."""
    self.done += count
    now = time.perf_counter()
    if now - self._last_tick >= TICK_SECONDS:
      self._last_tick = now
      log(f'  {self.description}: {self._count()} '
          f'({format_duration(now - self._start)})')

  def finish(self):
    seconds = time.perf_counter() - self._start
    what = self.result or (self._count() if self.unit else 'done')
    log(f'{self.description}: {what} in {seconds:.1f}s.')


@contextlib.contextmanager
def phase(description: str, total: int | None = None, unit: str = '') -> Iterator[Phase]:
  """`with phase('Reading train.en', unit='lines') as p: ... p.advance()`.

  Prints '<description>...' at the start and '<description>: <result> in 3.2s.' at the
  end (not when the work fails: the error says what happened).
  """
  log(f'{description}...')
  current = Phase(description, total, unit)
  yield current
  current.finish()
