"""Command line: `python -m vit_jax.main --config=configs/FILE.py[:ARGS] --workdir=DIR`.

Flags -> config -> mode (`config.trainer`) -> task. `--config.FIELD=VALUE` overrides any
config field; unknown fields are an error (the config is locked). A user's mistake prints
one line, `error: ...`, and exits non-zero; a bug keeps its traceback. On many hosts every
host runs the same command, with --coordinator_address, --num_processes and --process_id
unless a launcher sets them (`vit_jax.train.distributed`).
"""

import functools
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from vit_jax import entry, errors, files, runtime
from vit_jax.train import distributed, flag_errors, preemption

# Without --config, the config saved in --workdir by an earlier run (flag_errors.parse_flags
# puts it on the command line, so that it is parsed with the overrides).
_SAVED_CONFIG = os.path.join(os.path.dirname(__file__), 'train', 'saved_config.py')
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (configs/*.py[:ARGS]); default: WORKDIR/config.json.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory for checkpoints and metrics: local, or any filesystem '
    'tf.io.gfile reaches (gs://...). trainer=predict with config.pretrained needs none.')
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
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    'distributed_heartbeat_timeout', 100,
    'Seconds without a heartbeat after which a process counts as lost; the others then exit '
    'with an error naming it.')


def tune_malloc_for(config, on_cpu: bool) -> None:
  """Applies `config.tune_malloc` on CPU runs; call before JAX or TF start threads."""
  if config.get('tune_malloc') and on_cpu and not runtime.tune_malloc():
    # Printed as it is: asking JAX which process this is would start its backend too early.
    print('note: config.tune_malloc needs glibc (Linux); running without it (set it to False to '
          'leave this note out).', file=sys.stderr, flush=True)


# --- Modes: each a short function of (config, workdir) over the config's task. ---


def _task(config, workdir: str):
  # pylint: disable=g-import-not-at-top
  if config.task == 'classification':
    from vit_jax.train.classification import ClassificationTask
    return ClassificationTask(config, workdir)
  from vit_jax.train.translation import TranslationTask
  return TranslationTask(config, workdir)


def _train(config, workdir: str):
  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop, run_config, workdir_lock
  run_config.check_task(workdir, config.task)
  run_config.note_other_pixel_statistics(config, config.get('pretrained'), 'config.pretrained')
  with workdir_lock.held(workdir):
    return loop.train(config, workdir, _task(config, workdir))


def _evaluate(config, workdir: str):
  from vit_jax.train import checkpointing, loop, run_config  # pylint: disable=g-import-not-at-top
  run_config.check_task(workdir, config.task)
  checkpointing.require_checkpoint(workdir)  # Before the task writes its files there.
  run_config.note_other_pixel_statistics(config, workdir)
  return loop.evaluate(config, workdir, _task(config, workdir))


def _predict(config, workdir: str):
  from vit_jax.train import prediction, run_config  # pylint: disable=g-import-not-at-top
  run_config.note_other_pixel_statistics(config, workdir)
  return prediction.run(config, workdir)


def _translate(config, workdir: str):
  from vit_jax.train import translation  # pylint: disable=g-import-not-at-top
  return translation.translate(config, workdir)


def _visualize(config, workdir: str):
  from vit_jax.train import run_config, visualization  # pylint: disable=g-import-not-at-top
  run_config.note_other_pixel_statistics(config, workdir)
  return visualization.run(config, workdir)


MODES = {'train': _train, 'evaluate': _evaluate, 'predict': _predict,
         'translate': _translate, 'visualize': _visualize}
USE_EMA_MODES = ('predict', 'translate', 'visualize')  # The modes that config.use_ema applies to.


def run(config, workdir: str):
  """Runs mode `config.trainer` (see MODES and config.TRAINERS) on `config.task`.

  `config.tune_malloc` and `config.compilation_cache` are settings of the whole process,
  which `main` applies at start-up (`tune_malloc_for`, `runtime.use_compilation_cache`);
  callers of `run` apply them themselves, if at all.
  """
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  if config.task not in config_lib.TRAINERS:
    raise errors.ConfigError(f'Unknown config.task {config.task!r}; choose one of '
                             f'{sorted(config_lib.TRAINERS)}.')
  known = config_lib.TRAINERS[config.task]
  if config.trainer not in known:
    raise errors.ConfigError(f'config.trainer={config.trainer!r} is not a mode of the '
                             f'{config.task} task; choose one of {", ".join(known)}.')
  config_lib.check_ranges(config)
  if config.use_ema and config.trainer not in USE_EMA_MODES:
    raise errors.ConfigError(
        f'config.use_ema applies to trainer={"/".join(USE_EMA_MODES)}, not {config.trainer!r} '
        '(training and evaluate report the EMA weights beside the weights): leave it False.')
  if not 0 <= config.ema_decay < 1:
    raise errors.ConfigError(f'config.ema_decay={config.ema_decay} must be in [0, 1) (0: no '
                             'EMA; 0.9999 is usual).')
  if not config.ema_decay and not config.ema_warmup:
    raise errors.ConfigError('config.ema_warmup=False applies to an EMA, but config.ema_decay '
                             'is 0: set --config.ema_decay (e.g. 0.9999), or leave ema_warmup.')
  # pylint: disable=g-import-not-at-top
  import jax
  from vit_jax import kernels
  from vit_jax.train import out_of_memory
  with kernels.use(config.matmul, config.dropout_masks):
    try:
      return MODES[config.trainer](config, workdir)
    except jax.errors.JaxRuntimeError as error:
      if not out_of_memory.is_out_of_memory(error):
        raise
      raise errors.OutOfMemoryError(out_of_memory.message(config, error)) from error


def main(argv):
  if len(argv) > 1:
    raise errors.ConfigError(f'Unexpected arguments {argv[1:]}: flags are --NAME=VALUE, '
                             'config fields --config.FIELD=VALUE.')
  config, workdir = _CONFIG.value, _WORKDIR.value
  if workdir is not None and not workdir.strip():
    raise errors.ConfigError(f'--workdir={workdir!r} is empty; give a directory, e.g. '
                             '--workdir=runs/digits (a new one to train, or the workdir of a run).')
  flag_errors.check_values(config)
  if not config.task:
    raise errors.ConfigError(flag_errors.no_saved_config(workdir))
  flag_errors.switch_model_if_named(config, sys.argv, _SAVED_CONFIG)
  if workdir is None and not (config.trainer == 'predict' and config.get('pretrained')):
    raise errors.ConfigError('--workdir is required, e.g. python -m vit_jax.main '
                             '--config=configs/vit_digits.py --workdir=runs/digits')
  if workdir is not None and files.exists(workdir) and not files.isdir(workdir):
    raise errors.ConfigError(f'--workdir={workdir} is a file; give a directory (a new one to '
                             'train, or the workdir of a run).')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # Orbax and TF are chatty at INFO.
  on_cpu = runtime.jax_runs_on_cpu()  # Known before any backend starts.
  tune_malloc_for(config, on_cpu)  # First: before JAX, TF or orbax start threads.
  runtime.use_compilation_cache(config.get('compilation_cache', 'auto'), on_cpu)
  distributed.initialize(_DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                         _PROCESS_ID.value, _DISTRIBUTED_TIMEOUT.value, _HEARTBEAT_TIMEOUT.value)
  run(config, workdir)


def _main_with_errors(argv):
  try:
    with files.full_disk_as_one_line():  # Where no write site named the file.
      main(argv)
  except errors.UserError as error:
    print(f'error: {" ".join(str(error).split())}', file=sys.stderr)
    sys.exit(1)
  except preemption.Stopped as stopped:
    print(str(stopped), file=sys.stderr)
    sys.exit(stopped.exit_code)


if __name__ == '__main__':
  runtime.start_program()
  entry.run(app.run, _main_with_errors,
            flags_parser=functools.partial(flag_errors.parse_flags, default_spec=_SAVED_CONFIG))
