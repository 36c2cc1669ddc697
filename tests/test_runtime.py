"""The process-wide settings of a program (vit_jax.runtime)."""

import subprocess
import sys

from vit_jax import runtime

# A program that sets the collector as the command-line programs do, then leaves garbage
# in a reference cycle with a finalizer at exit.
_PROGRAM = """
import gc
from vit_jax import runtime
runtime.collect_garbage_sparingly()

class Noisy:
  def __init__(self, name):
    self.name, self.me = name, self
  def __del__(self):
    print('finalized', self.name, flush=True)

Noisy('garbage')
print('threshold', gc.get_threshold()[2], flush=True)
"""


def test_garbage_left_at_exit_is_still_finalized():
  """collect_garbage_sparingly collects once at exit, before it freezes what is left: the
  finalizers of unreachable cycles run, as Python's own finalization would run them."""
  out = subprocess.run([sys.executable, '-c', _PROGRAM], capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0] == f'threshold {runtime.PROGRAM_FULL_COLLECTION_THRESHOLD}'
  assert 'finalized garbage' in lines[1:]
