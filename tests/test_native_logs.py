"""C++ log lines written to descriptor 2 while libraries load: the INFO notes dropped, the rest
passed on, unless TF_CPP_MIN_LOG_LEVEL is 0."""

import os
import subprocess
import sys

from helpers import digits_command

# What a native library writes from C++ (descriptor 2, not sys.stderr), as JAX's CUDA plugin
# does at `import jax` on a machine without a GPU.
_CHILD = r'''
import os, sys
from vit_jax import native_logs
with native_logs.load_notes_dropped():
  os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written '
              b'to STDERR\n')
  os.write(2, b'I0000 00:00:1796671545.539947   13697 cudart_stub.cc:31] Could not find cuda '
              b'drivers on your machine, GPU will not be used.\n')
  os.write(2, b'W1207 19:25:55.981843   13697 plugin.cc:12] a warning\n')
  print('from Python', file=sys.stderr)
print('after', file=sys.stderr)
'''
_PREAMBLE = 'WARNING: All log messages before absl::InitializeLog()'
_NOTE = 'cudart_stub.cc:31] Could not find cuda drivers'


def _child(level: str | None, code: str = _CHILD) -> subprocess.CompletedProcess:
  env = {name: value for name, value in os.environ.items() if name != 'TF_CPP_MIN_LOG_LEVEL'}
  if level is not None:
    env['TF_CPP_MIN_LOG_LEVEL'] = level
  return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                        timeout=120, check=False)


def test_info_notes_are_dropped_and_the_rest_passes_in_order():
  out = _child('1')
  assert out.returncode == 0, out.stderr
  assert out.stderr == ('W1207 19:25:55.981843   13697 plugin.cc:12] a warning\n'
                        'from Python\nafter\n')


def test_level_0_or_unset_passes_every_line():
  for level in ('0', None):
    out = _child(level)
    assert out.returncode == 0, out.stderr
    assert _PREAMBLE in out.stderr and _NOTE in out.stderr and 'a warning' in out.stderr


def test_without_a_stderr_it_collects_nothing_and_runs():
  out = _child('1', 'import os\nos.close(2)\nfrom vit_jax import native_logs\n'
               'with native_logs.load_notes_dropped():\n  print("ran")\n')
  assert (out.returncode, out.stdout, out.stderr) == (0, 'ran\n', '')


def test_a_run_with_its_stderr_closed_trains(tmp_path):
  """`python -m vit_jax.main ... 2>&-`, as a daemon may start it: TensorFlow's import (the input
  pipeline's) has no stderr to filter, and the run goes on."""
  command = ['bash', '-c', 'exec "$@" 2>&-', 'bash', *digits_command(tmp_path / 'run', 2)]
  out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stdout
  assert '2 steps in' in out.stdout
