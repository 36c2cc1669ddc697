"""Orbax's failures in one line: why a checkpoint read failed, and the noise it leaves.

A failed read or write inside orbax leaves tracebacks behind it: orbax logs the failed
background save, and its other pending reads call back into a closed event loop. The
`Checkpointer` reports the failure itself, in one line; `quiet` drops those leftovers
(and only those).
"""

import logging
import re
import sys


class _SaveErrorTraceback(logging.Filter):
  """Drops the error logs, with tracebacks, of orbax's failed background saves and reads.

  Orbax logs them itself (through absl), and asyncio logs the write tasks of a failed save
  whose exceptions nobody retrieved; the exception that matters reaches `Checkpointer`,
  which reports it in one line.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    message = record.getMessage()
    if record.name == 'asyncio':  # The task may name orbax, or only TensorStore's spec.
      return not ('never retrieved' in message
                  and ('orbax' in message or 'tensorstore_spec' in message))
    return not ('orbax' in record.pathname
                and (record.exc_info or 'raised an exception' in message))


def _quiet_save_logs():
  for name in ('absl', 'asyncio'):  # Where orbax logs (through absl.logging), and asyncio.
    logger = logging.getLogger(name)
    if not any(isinstance(f, _SaveErrorTraceback) for f in logger.filters):
      logger.addFilter(_SaveErrorTraceback())


def _chain(error: BaseException):
  """`error`, then the errors it was raised from or during (orbax wraps TensorStore's)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def why(error: BaseException) -> str:
  """Why a checkpoint read failed: the file TensorStore names last, and its complaint."""
  for cause in _chain(error):
    text = ' '.join(str(cause).split())
    text = text.split(' [tensorstore_spec=', 1)[0]
    paths = re.findall(r'local file "([^"]+)"', text)
    if paths:
      complaint = text.rsplit(paths[-1] + '":', 1)[-1].strip() or first_line(cause)
      return f'{paths[-1]}: {complaint}'
  return first_line(error)


def first_line(error: BaseException) -> str:
  """The gist of a TensorStore/orbax error: its first line (it names the file), without the
  TensorStore spec that some messages append."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  text = lines[0] if lines else type(error).__name__
  text = re.split(r' See full TensorStore details| \[tensorstore_spec=', text)[0]
  return text if len(text) <= 300 else text[:297] + '...'


def _quiet_closed_loop_callbacks():
  """After a failed read or write, orbax's other pending ones call back into its closed loop.

  Installed before any checkpoint is read or written: the callbacks may come before the
  error does.

  Each would print a 'RuntimeError: Event loop is closed' traceback (through
  `sys.unraisablehook`) under the one-line report; those, and only those, are dropped.
  """
  previous = sys.unraisablehook
  if getattr(previous, 'vit_jax_quiet', False):
    return

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == 'Event loop is closed'):
      previous(unraisable)
  hook.vit_jax_quiet = True
  sys.unraisablehook = hook


def quiet():
  """Installs both filters (once per process)."""
  _quiet_save_logs()
  _quiet_closed_loop_callbacks()
