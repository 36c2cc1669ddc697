"""Compiling the CPU kernels' C++ sources on first use, and the CPU facts that depends on.

`build` compiles with the system C++ compiler ($CXX, else c++ or g++) for this CPU
(-march=native) into $VIT_JAX_CACHE (default ~/.cache/vit_jax), once for each set of sources,
flags, jaxlib version and CPU model; `vit_jax.kernels.blas` loads and registers the library.
"""

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from typing import Sequence

import jax

from vit_jax import errors


class KernelUnavailable(errors.UserError, RuntimeError):
  """The BLAS kernels cannot be used here; the message says why and what to do."""


@functools.cache
def cpuinfo() -> dict[str, str]:
  """The first processor's fields in /proc/cpuinfo ('vendor_id', 'model name', 'flags', ...);
  empty where it cannot be read."""
  fields = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if not line.strip():  # The first processor ends here.
          break
        name, _, value = line.partition(':')
        fields[name.strip()] = value.strip()
  except OSError:
    pass
  return fields


def _cpu_signature() -> str:
  """What -march=native depends on: the CPU model and its flags."""
  return platform.machine() + cpuinfo().get('model name', '') + cpuinfo().get('flags', '')


def build(sources: list[str], headers: Sequence[str] = ()) -> str:
  """Compiles `sources` into a shared library in the cache; returns its path."""
  compiler = os.environ.get('CXX') or shutil.which('c++') or shutil.which('g++')
  if compiler is None:
    raise KernelUnavailable(
        'No C++ compiler found to build the BLAS kernels (looked for $CXX, c++, g++). '
        "Install one (e.g. `apt install g++`) or use matmul='xla' (--config.matmul=xla).")
  flags = ['-O3', '-march=native', '-std=c++17', '-shared', '-fPIC', '-w',
           '-I', jax.ffi.include_dir()]
  digest = hashlib.sha256()
  files = [*sources, *headers]
  for part in (*(open(f, 'rb').read() for f in files), ' '.join(flags).encode(),
               jax.__version__.encode(), _cpu_signature().encode()):
    digest.update(part)
  cache = os.environ.get('VIT_JAX_CACHE', os.path.expanduser('~/.cache/vit_jax'))
  target = os.path.join(cache, 'kernels', f'vit_jax_cpu_{digest.hexdigest()[:16]}.so')
  if os.path.exists(target):
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  # Build beside the target and rename: concurrent processes never see half a file.
  fd, partial = tempfile.mkstemp(suffix='.so', dir=os.path.dirname(target))
  os.close(fd)
  try:
    result = subprocess.run([compiler, *flags, *sources, '-o', partial],
                            capture_output=True, text=True)
    if result.returncode:
      raise KernelUnavailable(f'Building the BLAS kernels failed ({compiler}):\n'
                              f'{result.stderr[-3000:]}')
    os.replace(partial, target)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return target
