"""TensorFlow for the input pipeline, with GPUs hidden so that JAX keeps the accelerators.

Import `tf` from here instead of `import tensorflow` in the data modules: the first import hides
every GPU from TensorFlow before it can reserve GPU memory. TensorFlow's C++ start-up notes
(INFO level) are silenced unless TF_CPP_MIN_LOG_LEVEL says otherwise, those its libraries log
while they load included (`native_logs`); its warnings and errors pass.
Functions given to tf.data (`map`, `scan`, `flat_map`) go through `as_written`.
"""

import os

from vit_jax import native_logs

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

with native_logs.load_notes_dropped():
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
