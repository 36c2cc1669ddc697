"""TensorFlow for the input pipeline, with GPUs hidden so that JAX keeps the accelerators.

Import `tf` from here instead of `import tensorflow` in the data modules: the first import hides
every GPU from TensorFlow before it can reserve GPU memory. TensorFlow's C++ start-up notes
(INFO level) are silenced unless TF_CPP_MIN_LOG_LEVEL says otherwise.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

try:
  tf.config.set_visible_devices([], 'GPU')
except RuntimeError:  # TF's devices were initialised by someone else already; nothing to undo.
  pass

__all__ = ['tf']
