"""Command line: `python -m vit_jax.main --config=configs/FILE.py[:ARGS] --workdir=DIR`.

Flags -> config -> trainer. `--config.KEY=VALUE` overrides any config field;
unknown fields are an error (the config is locked). On many hosts every host runs
the same command, with --coordinator_address, --num_processes and --process_id
unless a launcher sets them (`vit_jax.train.distributed`).
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from vit_jax import utils
from vit_jax.train import distributed

# Without --config, the config saved in --workdir by an earlier run.
_SAVED_CONFIG = os.path.join(os.path.dirname(__file__), 'train', 'saved_config.py')
_CONFIG = config_flags.DEFINE_config_file(
    'config', _SAVED_CONFIG, 'Config file (configs/*.py[:ARGS]); default: WORKDIR/config.json.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', distributed.MODES,
    "JAX's distributed runtime: 'auto' starts it when --coordinator_address, --num_processes, "
    "--process_id, their JAX_* environment variables or a Slurm / Open MPI launch of several "
    "processes ask for it; 'on' always (JAX also detects Cloud TPU and Kubernetes); 'off' never.")
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None,
    'HOST:PORT of process 0, which hosts the coordinator; default: $JAX_COORDINATOR_ADDRESS.')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'Number of processes (one per host); default: $JAX_NUM_PROCESSES.')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, "This process's id in 0..num_processes-1; default: $JAX_PROCESS_ID.")
_DISTRIBUTED_TIMEOUT = flags.DEFINE_integer(
    'distributed_timeout', 300,
    'Seconds to wait for all processes to connect to the coordinator before exiting with an error.')


def tune_malloc_for(config) -> None:
  """Applies `config.tune_malloc` on CPU runs; call before JAX or TF start threads."""
  if config.get('tune_malloc') and utils.jax_runs_on_cpu() and not utils.tune_malloc():
    logging.warning('config.tune_malloc needs glibc (Linux); running without it.')


def run(config, workdir: str):
  """Runs `config.trainer` ('train', 'evaluate', 'translate', 'visualize') on `config.task`.

  `config.tune_malloc` is a setting of the whole process, which `main` applies at
  start-up (`tune_malloc_for`); callers of `run` apply it themselves, if at all.
  """
  from vit_jax.train import loop  # Imported here so that --help stays fast.
  tasks = {'classification': 'vit_jax.train.classification:ClassificationTask',
           'translation': 'vit_jax.train.translation:TranslationTask'}
  trainers = {'train': loop.train, 'evaluate': loop.evaluate}
  if config.task not in tasks:
    raise ValueError(f'Unknown config.task {config.task!r}; choose one of {sorted(tasks)}.')
  if config.trainer == 'visualize':
    from vit_jax.train import visualization
    return visualization.run(config, workdir)
  if config.trainer == 'translate' and config.task == 'translation':
    from vit_jax.train import translation
    return translation.translate(config, workdir)
  if config.trainer not in trainers:
    known = sorted(trainers) + ['visualize'] + (
        ['translate'] if config.task == 'translation' else [])
    raise ValueError(f'Unknown config.trainer {config.trainer!r} for task {config.task}; '
                     f'choose one of {known}.')
  module_name, class_name = tasks[config.task].split(':')
  task = getattr(__import__(module_name, fromlist=[class_name]), class_name)(config, workdir)
  return trainers[config.trainer](config, workdir, task)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _WORKDIR.value is None:
    raise app.UsageError('--workdir is required, e.g.\n  python -m vit_jax.main '
                         '--config=configs/vit_digits.py --workdir=runs/digits')
  if not _CONFIG.value.task:
    raise app.UsageError(f'No --config given and {_WORKDIR.value} holds no config.json of an '
                         'earlier run; pass --config=configs/FILE.py, e.g. '
                         '--config=configs/vit_digits.py.')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # Orbax and TF are chatty at INFO.
  tune_malloc_for(_CONFIG.value)  # First: before JAX, TF or orbax start threads.
  try:
    distributed.initialize(_DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                           _PROCESS_ID.value, _DISTRIBUTED_TIMEOUT.value)
    run(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FileNotFoundError, RuntimeError) as error:
    print(f'error: {error}', file=sys.stderr)
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
