"""What native libraries (TensorFlow, JAX's plugins) write to stderr from C++, caught in Python.

Libraries log while they load, before their logging reads TF_CPP_MIN_LOG_LEVEL, so the variable
cannot silence those lines: on Intel CPUs TensorFlow's "oneDNN custom operations are on...",
and JAX's CUDA plugin's "Could not find cuda drivers on your machine" where there is no GPU
(three times at `import jax`, once more when JAX starts). `load_notes_dropped` drops such INFO
lines, and absl's preamble before them, unless TF_CPP_MIN_LOG_LEVEL is 0; warnings and errors
pass.
"""

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

# absl's note before the first C++ log line of a process: on Intel CPUs at TensorFlow's import,
# elsewhere at its first warning (e.g. of a cut JPEG). It says nothing of the data.
ABSL_PREAMBLE = re.compile(r'WARNING: All log messages before absl::InitializeLog\(\)')
# An INFO line of C++ logging (I1207 19:25:55.98 ...), or the preamble.
_LOAD_NOTE = re.compile(rf'I\d{{4}} |{ABSL_PREAMBLE.pattern}')


@contextlib.contextmanager
def stderr_captured() -> Iterator[list[str]]:
  """Collects the lines written to descriptor 2 inside it (C++ logging among them) into the
  list it yields, for the caller to pass on or not; without a stderr (None, or descriptor 2
  closed) collects nothing."""
  lines = []
  try:
    saved = os.dup(2) if sys.stderr is not None else None
  except OSError:  # Descriptor 2 is closed: nothing to collect.
    saved = None
  if saved is None:
    yield lines
    return
  sys.stderr.flush()
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield lines
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      lines += captured.read().decode(errors='replace').splitlines(keepends=True)


def pass_on(lines: list[str], dropping: re.Pattern) -> None:
  """Writes to stderr the `lines` that `dropping` does not match (nothing at all where none is
  left: with descriptor 2 closed, even an empty write fails)."""
  kept = ''.join(line for line in lines if not dropping.match(line))
  if kept:
    sys.stderr.write(kept)


@contextlib.contextmanager
def load_notes_dropped():
  """Drops the C++ INFO lines written to stderr inside it (unless TF_CPP_MIN_LOG_LEVEL is 0)
  and passes every other line on, once it ends."""
  if os.environ.get('TF_CPP_MIN_LOG_LEVEL', '0') == '0':
    yield
    return
  lines = []
  try:
    with stderr_captured() as lines:
      yield
  finally:
    pass_on(lines, _LOAD_NOTE)
