"""Stopping cleanly when asked: SIGTERM (what Slurm, Kubernetes and spot VMs send) or SIGINT.

The first signal asks the training loop to stop after the step it is in: the loop saves a
checkpoint of that step, says where, and exits with 128 + the signal's number, and rerunning
the same command resumes there. A second signal stops the process at once.

With several processes, JAX's coordination service receives SIGTERM on every host and
`reached_preemption_sync_point` makes all of them stop at the same step; SIGINT then keeps
its default (KeyboardInterrupt).
"""

import os
import signal
import threading

from vit_jax import progress

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
  """Training stopped on a signal after saving its checkpoint; `exit_code` is 128 + signum."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + signum


class StopRequests:
  """While entered, SIGTERM and SIGINT ask the loop to stop (`requested`) instead of killing it."""

  def __init__(self):
    self.signum: int | None = None
    self._previous = {}

  def __enter__(self):
    import jax  # pylint: disable=g-import-not-at-top
    if threading.current_thread() is not threading.main_thread():
      return self  # Signal handlers live in the main thread; elsewhere signals keep theirs.
    signals = _SIGNALS if jax.process_count() == 1 else ()  # SIGTERM: the sync point below.
    for signum in signals:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.signum is not None:  # The second signal: stop now, as if no handler were set.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.signum = signum
    progress.log(f'{name}: stopping after this step, once its checkpoint is saved (a second '
                 f'{name} stops at once).')

  def requested(self, step: int) -> bool:
    """Whether to stop after `step`; with several processes all of them agree on it."""
    import jax  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if jax.process_count() > 1:
      if multihost_utils.reached_preemption_sync_point(step):
        self.signum = self.signum or signal.SIGTERM
        return True
      return False
    return self.signum is not None

  def name(self) -> str:
    return signal.Signals(self.signum).name if self.signum else 'a signal'
