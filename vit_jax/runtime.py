"""The process's runtime: which backend JAX will start, glibc's malloc tuning, TensorFlow's
import without Keras, the garbage collector of a program, the compilation cache, its memory."""

import atexit
import ctypes
import gc
import importlib.metadata
import importlib.util
import os
import pkgutil
import resource
import sys

import jax

from vit_jax import errors


def jax_runs_on_cpu() -> bool:
  """Whether JAX's default backend is (or will be) the CPU, without starting it.

  True when JAX_PLATFORMS (or `jax.config.jax_platforms`) names 'cpu' first, or
  when it is unset and no accelerator plugin (CUDA, ROCm, TPU, ...) is installed.
  An installed plugin counts as an accelerator even where its device is missing.
  """
  platforms = jax.config.jax_platforms
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  # How JAX finds its plugins: modules in the `jax_plugins` namespace package,
  # entry points of the group 'jax_plugins', and the `libtpu` package.
  try:
    import jax_plugins  # pylint: disable=g-import-not-at-top
    plugins = list(pkgutil.iter_modules(jax_plugins.__path__))
  except ImportError:
    plugins = []
  plugins += list(importlib.metadata.entry_points(group='jax_plugins'))
  return not plugins and importlib.util.find_spec('libtpu') is None


def tune_malloc() -> bool:
  """Makes glibc keep and reuse freed memory: one arena, no mmap, no trimming.

  XLA:CPU allocates each execution's temporary buffer (GBs in training) with
  `posix_memalign`, which glibc serves with a fresh `mmap`: every step then
  page-faults the whole buffer in again. Call it first thing, before JAX's
  backend (or TF, or torch) starts its threads: glibc fixes its arena limit
  when it first makes an arena for a new thread, so a later call leaves one
  arena per thread (README.md, Benchmarks, has what each costs). `python -m
  vit_jax.main` and the benchmark call it at start-up on CPU runs. Returns
  whether it applied (glibc only).
  """
  if not sys.platform.startswith('linux'):
    return False
  try:
    libc = ctypes.CDLL('libc.so.6')
  except OSError:
    return False
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # From glibc's malloc.h.
  # A trim threshold of -1 disables trimming (see `man mallopt`).
  return all(libc.mallopt(option, value) == 1 for option, value in (
      (m_arena_max, 1), (m_mmap_max, 0), (m_trim_threshold, -1)))


def tensorflow_without_keras() -> None:
  """Keeps `import tensorflow` from importing Keras, in programs that never use Keras.

  Importing TensorFlow imports Keras 3's optimizers (so that SavedModels of Keras objects
  load), and with them scikit-learn, SciPy and matplotlib: about two fifths of the import's
  time, paid by every start of the trainer. With TF_USE_LEGACY_KERAS=1 TensorFlow looks for
  tf_keras instead and, where it is not installed, skips the import; tf.data, tf.io and
  SavedModels without Keras objects work as before. The command-line programs call it first
  thing; the library never does (a user's own `tf.keras` stays Keras 3). A value the user
  set is kept.
  """
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')


# Full collections wait for this many younger (generation 1) collections; Python's is 10.
PROGRAM_FULL_COLLECTION_THRESHOLD = 100


def collect_garbage_sparingly() -> None:
  """Keeps Python's cycle collector from scanning what the imports made, over and over.

  Importing JAX, TensorFlow and orbax makes hundreds of thousands of objects that live until
  the program ends, and each full collection scans them all: several times while a program
  starts, and again in Python's finalization at exit. Here a full collection waits for
  PROGRAM_FULL_COLLECTION_THRESHOLD younger collections instead of 10 (and, as before, until
  the long-lived objects have grown by a quarter). At exit, after the handlers registered
  later, the garbage is collected once (its finalizers run) and what is left is frozen
  (`gc.freeze`), which the finalization's collections then skip. The command-line programs
  call it first thing; the library never does.
  """
  young, middle, _ = gc.get_threshold()
  gc.set_threshold(young, middle, PROGRAM_FULL_COLLECTION_THRESHOLD)
  atexit.register(_collect_and_freeze)


def _collect_and_freeze() -> None:
  gc.collect()
  gc.freeze()


def start_program() -> None:
  """What the command-line programs set first thing: TensorFlow's import without Keras, and
  the garbage collector (`tensorflow_without_keras`, `collect_garbage_sparingly`)."""
  tensorflow_without_keras()
  collect_garbage_sparingly()


# Where 'auto' keeps compiled programs on accelerators, below $XDG_CACHE_HOME (else ~/.cache).
USER_CACHE_SUBDIR = os.path.join('vit_jax', 'xla')


def compilation_cache_dir(setting: str, on_cpu: bool) -> str | None:
  """The directory that `config.compilation_cache` names for a run; None: no cache.

  'auto' is $JAX_COMPILATION_CACHE_DIR where set; else, on accelerators only, vit_jax/xla in
  the user's cache directory ($XDG_CACHE_HOME, else ~/.cache). Not on CPUs: there XLA checks a
  cached program against the host's CPU features, and on some Intel CPUs every check fails
  (jax-ml/jax#38445) with error lines at each start.
  """
  if setting == 'off':
    return None
  if not setting:
    raise errors.ConfigError("config.compilation_cache is empty: name a directory, 'auto' or "
                             "'off'.")
  if setting != 'auto':
    return os.path.expanduser(setting)
  if os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    return os.environ['JAX_COMPILATION_CACHE_DIR']
  if on_cpu:
    return None
  cache_home = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(cache_home, USER_CACHE_SUBDIR)


def use_compilation_cache(setting: str, on_cpu: bool) -> str | None:
  """Keeps compiled programs in `compilation_cache_dir(setting, on_cpu)` for later starts.

  JAX's persistent compilation cache: a program that took at least
  `jax_persistent_cache_min_compile_time_secs` (1 s by default) to compile is written there,
  and a later process that compiles the same program (same JAX, flags and devices) reads it
  instead. A directory that cannot be used costs a warning, never the run. Call before the
  first compilation. Returns the directory, or None.
  """
  directory = compilation_cache_dir(setting, on_cpu)
  jax.config.update('jax_compilation_cache_dir', directory)
  return directory


def peak_resident_bytes() -> int:
  """This process's peak resident memory as the kernel counts it (getrusage), in bytes."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak if sys.platform == 'darwin' else peak * 1024  # Linux reports KiB.


def resident_bytes() -> tuple[int | None, int]:
  """(resident memory now, None where unknown; the peak so far) of this process, in bytes."""
  peak = peak_resident_bytes()
  try:
    with open('/proc/self/statm') as f:  # Pages: total, resident, ...
      now = int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
  except (OSError, ValueError, IndexError):
    return None, peak
  return now, max(now, peak)  # The kernel's peak can lag the pages just touched.
