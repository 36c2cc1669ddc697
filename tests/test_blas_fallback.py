"""Where the BLAS kernels cannot run: what 'auto' picks instead, what 'blas' tells the user, and
that a failed build or a missing BLAS costs nothing else. These run where the kernels cannot be
built (tests/test_blas.py is skipped there)."""

import os
import subprocess
import sys

import jax
import pytest
from helpers import on_numpys_openblas

from vit_jax.kernels import blas, build


def test_explicit_blas_on_another_backend_says_it_runs_on_cpus(monkeypatch):
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  with pytest.raises(blas.KernelUnavailable, match="run on CPUs.*backend here is 'gpu'"):
    blas.resolve_matmul('blas')
  assert blas.resolve_matmul('auto') == 'xla'


def test_without_a_blas_auto_falls_back_and_blas_says_why(tmp_path):
  """A fresh process that finds no BLAS: 'auto' runs XLA, 'blas' names the problem."""
  script = (
      'from vit_jax import models\n'
      'from vit_jax.kernels import blas\n'
      "print('auto ->', blas.resolve_matmul('auto'))\n"
      "print('attention ->', models.resolve_attention_impl('auto', backend='cpu'))\n"
      'try:\n'
      "  blas.resolve_matmul('blas')\n"
      'except blas.KernelUnavailable as error:\n'
      "  print('blas ->', error)\n")
  env = {**os.environ, 'VIT_JAX_BLAS': str(tmp_path / 'libnothing.so'),
         'VIT_JAX_CACHE': str(tmp_path / 'cache')}
  out = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert 'auto -> xla' in out.stdout and 'attention -> head_major' in out.stdout
  assert 'blas -> No ILP64 CBLAS found' in out.stdout and 'libnothing.so' in out.stdout
  assert "pip install 'vit_jax[mkl]'" in out.stdout


def test_without_mkl_auto_builds_nothing(tmp_path):
  """Where the BLAS found is OpenBLAS, 'auto' runs XLA on any CPU without compiling the
  kernels first (a first start would wait for the C++ compiler for nothing)."""
  cache = tmp_path / 'cache'
  out = on_numpys_openblas(
      'from vit_jax import kernels, models\n'
      'from vit_jax.kernels import blas\n'
      "with kernels.use('auto'):\n"
      "  print(blas.resolve_matmul('auto'), models.resolve_attention_impl('auto', backend='cpu'))\n",
      VIT_JAX_CACHE=str(cache))
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ['xla', 'head_major']
  assert not cache.exists()


def test_a_failed_build_is_reported(tmp_path, monkeypatch):
  monkeypatch.setenv('CXX', 'false')
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path))
  source = tmp_path / 'kernel.cc'
  source.write_text('int f() { return 0; }\n')
  with pytest.raises(blas.KernelUnavailable, match=r'Building the BLAS kernels failed \(false\)'):
    build.build([str(source)])
  assert not list((tmp_path / 'kernels').iterdir())  # No half-written library left.


def test_kernel_sources_ship_as_package_data():
  """A non-editable install must carry every file the first-use build reads."""
  import fnmatch
  import tomllib
  with open(os.path.join(os.path.dirname(__file__), '..', 'pyproject.toml'), 'rb') as f:
    patterns = tomllib.load(f)['tool']['setuptools']['package-data']['vit_jax.kernels']
  for name in blas.SOURCES + blas.HEADERS:
    assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), (name, patterns)
