"""TensorFlow as the input pipeline imports it: quiet, and without GPUs."""

import ast
import os
import subprocess
import sys

import conftest
from helpers import REPO


def test_importing_tensorflow_prints_nothing():
  # On Intel CPUs TensorFlow's oneDNN note ("oneDNN custom operations are on...") came at every
  # start of every command, twice, whatever TF_CPP_MIN_LOG_LEVEL said.
  env = {name: value for name, value in os.environ.items() if not name.startswith('TF_')}
  out = subprocess.run(
      [sys.executable, '-c', 'from vit_jax.data.tf_cpu import tf; '
       "print(tf.config.get_visible_devices('GPU'))"],
      capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
  assert out.returncode == 0, out.stderr
  assert out.stdout == '[]\n'
  assert out.stderr == ''


def test_test_modules_that_import_tensorflow_are_left_out_where_it_is_missing():
  """A module importing TensorFlow at its top would fail to collect on JAX's CUDA images."""
  importing = set()
  for path in sorted((REPO / 'tests').glob('test_*.py')):
    for node in ast.parse(path.read_text()).body:
      names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
               [node.module] if isinstance(node, ast.ImportFrom) else [])
      if any(name and (name.split('.')[0] in ('tensorflow', 'tensorflow_datasets')
                       or name == 'vit_jax.data.tf_cpu') for name in names):
        importing.add(path.stem)
  assert importing and importing <= set(conftest.NEEDS_TENSORFLOW_MODULES), (
      importing - set(conftest.NEEDS_TENSORFLOW_MODULES))


def test_tests_that_train_on_digits_are_left_out_where_tensorflow_is_missing():
  """The trainer on digits reads through tf.data: such a test elsewhere is listed by name."""
  unlisted = []
  for path in sorted((REPO / 'tests').glob('test_*.py')):
    if path.stem in conftest.NEEDS_TENSORFLOW_MODULES:
      continue
    for node in ast.parse(path.read_text()).body:
      if (isinstance(node, ast.FunctionDef) and node.name.startswith('test_')
          and 'digits_command(' in ast.unparse(node)
          and f'{path.name}::{node.name}' not in conftest.NEEDS_TENSORFLOW_TESTS):
        unlisted.append(f'{path.name}::{node.name}')
  assert not unlisted, unlisted

