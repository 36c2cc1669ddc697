"""TensorFlow for the input pipeline, with GPUs hidden so that JAX keeps the accelerators.

Import `tf` from here instead of `import tensorflow` in the data modules: the first import hides
every GPU from TensorFlow before it can reserve GPU memory.
"""

import tensorflow as tf

try:
  tf.config.set_visible_devices([], 'GPU')
except RuntimeError:  # TF's devices were initialised by someone else already; nothing to undo.
  pass

__all__ = ['tf']
