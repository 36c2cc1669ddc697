"""How every `python -m vit_jax...` program ends: with its main's status; quietly where the
reader of its output stopped reading (`... | head`) or Ctrl-C came first, as `cat` does."""

import os
import select
import sys
from typing import Any, Callable, NoReturn


def run(main: Callable[..., Any], *args, **kwargs) -> NoReturn:
  """Exits with `main(*args, **kwargs)`'s status.

  A write to stdout whose reader has gone (BrokenPipeError) ends the program with status 1
  and nothing more said; any other broken pipe (a socket's) keeps its traceback. SIGINT where
  the program does not handle it (training does, from its first step: `train.preemption`)
  ends it by SIGINT, as Python would, without the traceback of wherever it was (reading the
  data, compiling), as SIGTERM does.
  """
  try:
    status = main(*args, **kwargs)
    sys.stdout.flush()
  except KeyboardInterrupt:
    # Python prints it through sys.excepthook (here: nothing), cleans up (atexit) and ends
    # the process by SIGINT.
    sys.excepthook = _say_nothing
    raise
  except BrokenPipeError:
    if not _reader_gone():
      raise
    # Python flushes stdout once more at exit, which would fail again, on stderr.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)
  sys.exit(status)


def _say_nothing(*exc_info) -> None:
  del exc_info


def _reader_gone() -> bool:
  """Whether stdout is a pipe whose reading end is closed (poll's POLLERR)."""
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # Errors only: they are always reported.
    return any(event & select.POLLERR for _, event in poller.poll(0))
  except (AttributeError, OSError, ValueError):  # No stdout, or no poll on this platform.
    return False
