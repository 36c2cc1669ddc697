"""What a run tells its user while it works: log lines, long phases, progress counts.

Printed on process 0 only (every process computes the same numbers): `log` lines to stdout,
`Phase` lines to stderr; `log_on_every_process` for what each process says of its own share.
"""

import contextlib
import sys
import threading
import time
from typing import Iterator

import jax

SLOW_SECONDS = 2.0  # Work that takes longer says what it is doing.
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


def log_on_every_process(message: str):
  """Prints `message` on every process: for what differs between them (each one's share of the
  data)."""
  print(message, flush=True)


def note(message: str):
  """Prints `message` on process 0's stderr: for modes whose stdout is their output."""
  if jax.process_index() == 0:
    print(message, file=sys.stderr, flush=True)


class Phase:
  """A piece of work that may take long: says so when it does, how far it is, and when it ends.

  Nothing is printed for work done within SLOW_SECONDS. Past that, a line says what is
  under way, progress lines follow at most every TICK_SECONDS, and a last line says what
  was done and how long it took. Phase lines go to stderr, so that stdout keeps a mode's
  own output (translations, predictions).
  """

  def __init__(self, description: str, total: int | None = None, unit: str = ''):
    self.description, self.total, self.unit = description, total, unit
    self.done = 0
    self.result = ''  # Said at the end, e.g. '29,000 lines'.
    self._start = self._last_tick = time.perf_counter()
    self._announced = False
    self._timer = threading.Timer(SLOW_SECONDS, self._announce)
    self._timer.daemon = True
    self._timer.start()

  def _print(self, message: str):
    if jax.process_index() == 0:
      print(message, file=sys.stderr, flush=True)

  def _announce(self):
    self._announced = True
    self._print(f'{self.description}...')

  def _count(self) -> str:
    total = f' of {self.total:,}' if self.total is not None else ''
    return f'{self.done:,}{total} {self.unit}'.rstrip()

  def advance(self, count: int = 1):
    """Counts `count` more done; prints a progress line at most every TICK_SECONDS."""
    self.done += count
    now = time.perf_counter()
    if self._announced and now - self._last_tick >= TICK_SECONDS:
      self._last_tick = now
      self._print(f'  {self.description}: {self._count()} '
                  f'({format_duration(now - self._start)})')

  def cancel(self):
    """Ends the phase without its last line (the work failed; the error says how)."""
    self._timer.cancel()

  def finish(self):
    self._timer.cancel()
    if self._announced:
      seconds = time.perf_counter() - self._start
      what = self.result or (self._count() if self.unit else 'done')
      self._print(f'{self.description}: {what} in {seconds:.1f}s.')


@contextlib.contextmanager
def phase(description: str, total: int | None = None, unit: str = '') -> Iterator[Phase]:
  """`with phase('Reading train.en', unit='lines') as p: ... p.advance()` (see `Phase`).

  The last line is printed when the work succeeds; on an error the error says what happened.
  """
  current = Phase(description, total, unit)
  try:
    yield current
  except BaseException:
    current.cancel()
    raise
  current.finish()
