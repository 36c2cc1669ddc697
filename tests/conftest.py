"""One XLA compilation cache for the whole test run.

Many tests compile the same tiny models' steps (in this process, in xdist workers and
in the subprocesses of the multi-device tests). JAX's persistent compilation cache,
in a directory made for this run and removed after it, compiles each of them once:
about a third off `tests/test_train.py` on 2 cores. The environment variables reach
the workers and subprocesses; a cache directory the user set is left alone.
"""

import os
import shutil
import tempfile

_WORKER = 'PYTEST_XDIST_WORKER' in os.environ
_OWN_CACHE = None

if not _WORKER and 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix='vit_jax_tests_xla_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _OWN_CACHE
  # Cache what takes noticeably long to compile; tiny programs compile faster than a read.
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _OWN_CACHE:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
