"""One XLA compilation cache for the whole test run; float32 products in float32.

Many tests compile the same tiny models' steps (in this process, in xdist workers and
in the subprocesses of the multi-device tests). JAX's persistent compilation cache,
in a directory made for this run and removed after it, compiles each of them once:
about a third off `tests/test_train.py` on 2 cores. The environment variables reach
the workers and subprocesses; a cache directory the user set is left alone.
"""

import importlib.util
import os
import shutil
import tempfile

import pytest

# The fixtures that test_export.py and test_export_cli.py share (session-scoped: built once).
pytest_plugins = ['export_fixtures']

# No test uses Keras: TensorFlow's import then skips it (vit_jax.runtime.tensorflow_without_keras,
# which the programs call), in this process, the workers and every subprocess they start.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

# The test processes run the collector as the programs do: the workers hold JAX's,
# TensorFlow's and torch's objects, which every full collection would scan again.
from vit_jax import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

runtime.collect_garbage_sparingly()

# Where timm is installed (for the comparisons), load it first: triton, which torch loads
# for timm, crashes (SIGSEGV) a process that has loaded TensorFlow before it.
if importlib.util.find_spec('timm') is not None:
  import timm  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

# What reads data through tf.data (the input pipeline, the trainer on digits, image folders or
# text, the documented commands, the notebooks): not run where TensorFlow is not installed
# (JAX's CUDA images), and the summary names them. The rest runs there, GPU paths included.
NEEDS_TENSORFLOW_MODULES = (
    'test_benchmark_data', 'test_checkpointing', 'test_data_erasing', 'test_data_images',
    'test_data_mixing', 'test_data_normalization', 'test_data_sources', 'test_data_text_sources',
    'test_data_tf_cpu', 'test_distillation', 'test_distributed', 'test_docs', 'test_ema',
    'test_errors', 'test_evaluation', 'test_export', 'test_export_cli', 'test_export_translation',
    'test_files', 'test_make_image_folder', 'test_mesh', 'test_notebooks', 'test_prediction',
    'test_preemption', 'test_train', 'test_train_order')
NEEDS_TENSORFLOW_TESTS = (
    'test_distributed_start.py::test_a_lost_process_is_named_by_the_others',
    'test_native_logs.py::test_a_run_with_its_stderr_closed_trains',
    'test_optim.py::test_the_trainer_applies_layer_decay_and_prints_its_table',
    'test_runtime.py::test_a_second_start_reads_the_programs_the_first_compiled',
    'test_runtime.py::test_an_unusable_compilation_cache_costs_a_warning_not_the_run',
    'test_visualize.py::test_visualize_image_files_and_missing_checkpoint',
    'test_visualize.py::test_drawing_test_images_of_a_cached_run_decodes_one_batch_and_says_nothing')
_WITHOUT_TENSORFLOW = 'TensorFlow is not installed (the input pipeline reads with tf.data)'
# Looked up, not imported: the controller process then never loads TensorFlow.
TENSORFLOW_MISSING = importlib.util.find_spec('tensorflow') is None


def pytest_ignore_collect(collection_path, config):
  del config
  if TENSORFLOW_MISSING and collection_path.stem in NEEDS_TENSORFLOW_MODULES:
    return True
  return None


def pytest_collection_modifyitems(items):
  if TENSORFLOW_MISSING:
    for item in items:
      if item.nodeid.split('/')[-1].split('@')[0] in NEEDS_TENSORFLOW_TESTS:  # @xdist_group
        item.add_marker(pytest.mark.skip(reason=_WITHOUT_TENSORFLOW))


_WORKER = 'PYTEST_XDIST_WORKER' in os.environ
_OWN_CACHE = None

# The tests' models are tiny: compiling takes longer than running. On CPUs, XLA's LLVM backend
# then skips its optimization passes (XLA's own HLO passes and fusions still run): about a
# fifth off each trainer start. Results may differ in the last bits, as between machines.
# Set before any JAX backend starts; reaches the workers and the subprocesses (those that
# set a device count keep it: tests/test_distributed.py, test_mesh.py, test_evaluation.py).
_NO_LLVM_OPTIMIZATION = '--xla_backend_optimization_level=0'
if not _WORKER and 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  if runtime.jax_runs_on_cpu():
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {_NO_LLVM_OPTIMIZATION}'.strip()

if not _WORKER and 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix='vit_jax_tests_xla_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _OWN_CACHE
  # Cache what takes noticeably long to compile; tiny programs compile faster than a read.
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')


@pytest.fixture(autouse=True, scope='session')
def _float32_products_in_float32():
  """Full float32 products on accelerators, as on CPUs.

  GPUs multiply float32 in TF32 by default (10-bit mantissa): two correct
  implementations then differ by ~1e-3, and the tests that compare them would
  measure the hardware's rounding instead of the code.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() != 'cpu':
    jax.config.update('jax_default_matmul_precision', 'highest')
  yield


def pytest_terminal_summary(terminalreporter):
  """How many documented commands test_docs ran from each source (README section, config...);
  the test modules left out where TensorFlow is not installed."""
  if TENSORFLOW_MISSING:
    terminalreporter.write_line(f'not run, {_WITHOUT_TENSORFLOW}: '
                                + ', '.join(f'{name}.py' for name in NEEDS_TENSORFLOW_MODULES))
  counts = []
  for report in terminalreporter.stats.get('passed', []):
    for name, value in getattr(report, 'user_properties', []):
      if name == 'commands':
        test = report.nodeid.rsplit('@', 1)[0]  # Without its @xdist_group.
        counts.append((test.split('[', 1)[-1].rstrip(']'), value))
  if counts:
    terminalreporter.write_sep('-', 'documented commands run, by source')
    for source, count in sorted(counts):
      terminalreporter.write_line(f'{count:3d}  {source}')
    terminalreporter.write_line(f'{sum(c for _, c in counts):3d}  in all')


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _OWN_CACHE:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
