"""`python -m vit_jax.benchmark`: see `vit_jax.benchmark.cli`."""

import os

# Before TensorFlow loads: its warnings (grappler cannot cost the crop of an image of unknown
# size, once per pipeline built) would drown the tables of --mode data.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from vit_jax import entry, native_logs  # pylint: disable=wrong-import-position

with native_logs.load_notes_dropped():  # JAX's CUDA plugin without a GPU (--compile-for).
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
  from vit_jax.benchmark import cli  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  runtime.start_program()
  entry.run(cli.main)
