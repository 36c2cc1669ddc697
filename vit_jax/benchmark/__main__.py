"""`python -m vit_jax.benchmark`: see `vit_jax.benchmark.cli`."""

import sys

from vit_jax.benchmark import cli

if __name__ == '__main__':
  sys.exit(cli.main())
