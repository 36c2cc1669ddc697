"""TensorFlow as the input pipeline imports it: quiet, and without GPUs."""

import os
import subprocess
import sys

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
