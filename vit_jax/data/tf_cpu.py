"""TensorFlow for the input pipeline, with GPUs hidden so that JAX keeps the accelerators.

Import `tf` from here instead of `import tensorflow` in the data modules: the first import hides
every GPU from TensorFlow before it can reserve GPU memory. TensorFlow's C++ start-up notes
(INFO level) are silenced unless TF_CPP_MIN_LOG_LEVEL says otherwise, those its libraries log
while they load included (which the variable does not reach); its warnings and errors pass.
Functions given to tf.data (`map`, `scan`, `flat_map`) go through `as_written`.
"""

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

# absl's note before the first C++ log line of a process: on Intel CPUs at TensorFlow's import,
# elsewhere at its first warning (e.g. of a cut JPEG). It says nothing of the data.
ABSL_PREAMBLE = re.compile(r'WARNING: All log messages before absl::InitializeLog\(\)')
# What TensorFlow's C++ libraries log while they load, before its logging reads
# TF_CPP_MIN_LOG_LEVEL: on Intel CPUs "oneDNN custom operations are on...", twice, at every start.
_EARLY_INFO = re.compile(rf'I\d{{4}} |{ABSL_PREAMBLE.pattern}')


@contextlib.contextmanager
def stderr_captured() -> Iterator[list[str]]:
  """Collects the lines written to descriptor 2 inside it (TensorFlow's C++ logging among them)
  into the list it yields, for the caller to pass on or not; without a stderr (None, or
  descriptor 2 closed) collects nothing."""
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


@contextlib.contextmanager
def _early_info_dropped():
  """Drops the INFO lines written to stderr inside it (unless TF_CPP_MIN_LOG_LEVEL is 0) and
  passes every other line on."""
  if os.environ['TF_CPP_MIN_LOG_LEVEL'] == '0':
    yield
    return
  lines = []
  try:
    with stderr_captured() as lines:
      yield
  finally:
    sys.stderr.write(''.join(line for line in lines if not _EARLY_INFO.match(line)))


with _early_info_dropped():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

try:
  tf.config.set_visible_devices([], 'GPU')
except RuntimeError:  # TF's devices were initialised by someone else already; nothing to undo.
  pass


def as_written(fn):
  """`fn` for tf.data to trace as written, without AutoGraph.

  AutoGraph would first rewrite the Python source of `fn` and of everything it calls, which
  is most of a pipeline's build time. The input functions need none of it: they branch with
  `tf.cond` and `tf.where`, never with a Python `if` on a tensor.
  """
  return tf.autograph.experimental.do_not_convert(fn)


__all__ = ['as_written', 'tf']
