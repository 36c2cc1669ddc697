"""JAX's distributed runtime for runs on many hosts, and gathering text across processes.

Every host runs the same command, one process per host; `initialize` (called by
`vit_jax.main` before anything touches devices) connects the processes through
the coordinator that process 0 hosts. Where the settings come from, first
match wins: the --coordinator_address / --num_processes / --process_id flags,
the environment variables JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
JAX_PROCESS_ID, then JAX's detection of the launcher (Slurm, Open MPI; with
`mode='on'` also Cloud TPU and Kubernetes).

When a process dies, the others' next collective fails (on CPUs within seconds; where a
collective would wait instead, JAX's heartbeat, --distributed_heartbeat_timeout, ends it);
`exit_lost_process` then finds which process is gone and exits with one line naming it.
"""

import collections
import dataclasses
import os
import sys
import threading
import time
from typing import Mapping, NoReturn

import jax
from jax.experimental import multihost_utils
import numpy as np

from vit_jax import errors, progress

# 'auto': start the runtime when settings or a multi-process launcher ask for it; 'on': always
# (JAX detects what is not given); 'off': never.
MODES = ('auto', 'on', 'off')
# JAX reads JAX_COORDINATOR_ADDRESS itself; the process count and id only as arguments.
ENV_VARS = {'coordinator_address': 'JAX_COORDINATOR_ADDRESS',
            'num_processes': 'JAX_NUM_PROCESSES', 'process_id': 'JAX_PROCESS_ID'}
# The variables by which JAX recognises a launcher (jax._src.clusters), and its process count.
_LAUNCHERS = {
    'Slurm': (('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_PROCID', 'SLURM_LOCALID'),
              'SLURM_NTASKS'),
    'Open MPI': (('OMPI_MCA_orte_hnp_uri', 'OMPI_COMM_WORLD_RANK'), 'OMPI_COMM_WORLD_SIZE'),
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """The arguments of `jax.distributed.initialize`; None: JAX detects it from the launcher."""
  coordinator_address: str | None
  num_processes: int | None
  process_id: int | None
  source: str  # Where they came from, for messages: '--num_processes, ...', 'Slurm (...)'.


def _as_int(name: str, value) -> int | None:
  if value is None or isinstance(value, int):
    return value
  try:
    return int(value)
  except ValueError:
    raise errors.ConfigError(f'{name}={value!r} is not an integer.') from None


def _launcher(environ: Mapping[str, str]) -> str | None:
  """'Slurm (SLURM_NTASKS=4)' when a launcher JAX knows started more than one process."""
  for name, (required, count_var) in _LAUNCHERS.items():
    if all(var in environ for var in required + (count_var,)):
      if _as_int(count_var, environ[count_var]) > 1:
        return f'{name} ({count_var}={environ[count_var]})'
  return None


def settings(mode: str = 'auto', coordinator_address: str | None = None,
             num_processes: int | None = None, process_id: int | None = None,
             environ: Mapping[str, str] | None = None) -> Settings | None:
  """What `initialize` would start with, from flags, environment and launcher; None: nothing.

  Raises:
    ValueError: an unknown mode, flags with mode 'off', values that are incomplete without a
      launcher to complete them, or out of range.
  """
  if mode not in MODES:
    raise errors.ConfigError(f'--distributed={mode!r} is not one of {MODES}.')
  environ = os.environ if environ is None else environ
  flag_values = {'coordinator_address': coordinator_address, 'num_processes': num_processes,
                 'process_id': process_id}
  given_flags = [f'--{name}' for name, value in flag_values.items() if value is not None]
  if mode == 'off':
    if given_flags:
      raise errors.ConfigError(f'{", ".join(given_flags)} given with --distributed=off, which runs '
                               'a single process; drop one or the other.')
    return None
  values, sources = {}, []
  for name, flag_value in flag_values.items():
    env_value = environ.get(ENV_VARS[name]) or None
    if flag_value is not None:
      values[name] = flag_value
      sources.append(f'--{name}')
    elif env_value is not None:
      values[name] = env_value if name == 'coordinator_address' else _as_int(ENV_VARS[name],
                                                                             env_value)
      sources.append(ENV_VARS[name])
    else:
      values[name] = None
  launcher = _launcher(environ)
  if launcher:
    sources.append(launcher)
  if not sources and mode == 'auto':
    return None
  missing = [name for name, value in values.items() if value is None]
  if mode == 'auto' and missing and not launcher:
    raise errors.ConfigError(
        f'{", ".join(sources)} asked for a run on many processes, but '
        f'{" and ".join("--" + name for name in missing)} (or '
        f'{" and ".join(ENV_VARS[name] for name in missing)}) are not set. Set all three on '
        'every process, or start the processes with a launcher that sets them (Slurm, Open MPI).')
  address, count, index = (values['coordinator_address'], values['num_processes'],
                           values['process_id'])
  if address is not None:
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit():
      raise errors.ConfigError(f"coordinator_address={address!r} is not HOST:PORT; use process "
                               "0\'s host name or IP address and a free port, e.g. 10.0.0.1:1234.")
    if not 0 < int(port) < 65536:
      raise errors.ConfigError(f'coordinator_address={address!r}: port {port} is not a TCP port '
                               '(1 to 65535); use a free port of process 0, e.g. '
                               f'{host}:1234.')
  if count is not None and count < 1:
    raise errors.ConfigError(f'num_processes={count} must be at least 1.')
  if index is not None and count is not None and not 0 <= index < count:
    raise errors.ConfigError(f'process_id={index} must be in [0, num_processes={count}); give each '
                             f'of the {count} processes its own id 0..{count - 1}.')
  return Settings(address, count, index, ', '.join(sources) or '--distributed=on')


def _timeout_message(config: Settings, timeout: int) -> str:
  address = config.coordinator_address or 'the address the launcher gave'
  where = (f"JAX's distributed runtime (settings from {config.source}) did not start within "
           f'--distributed_timeout={timeout}s')
  index, count = config.process_id, config.num_processes
  if index == 0 and count is not None:
    return (f'{where}: process 0 hosts the coordinator at {address}, but not all {count} '
            'processes registered with it. Check that every process was started with '
            f'num_processes={count}, its own process_id in 0..{count - 1} and the same '
            f'coordinator address, that {address} names this host, and that its port is open '
            'to the other hosts.')
  if index is not None and count is not None:
    return (f'{where}: process {index} of {count} could not register with the coordinator at '
            f'{address}. Check that process 0 is running there (it hosts the coordinator), '
            f'that {address} is reachable from this host (host name, firewall), and that every '
            'process has the same num_processes.')
  return (f'{where}: the coordinator at {address} did not hear from all processes. Check '
          "that every process of the job was started and can reach process 0's host, or pass "
          '--distributed=off for a single-process run.')


def exit_at_once(message: str) -> NoReturn:
  """Prints `error: MESSAGE` and exits with status 1 without JAX's shutdown, which would wait
  for the other processes (or for a connection) and abort with a stack dump."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  os._exit(1)


def initialize(mode: str = 'auto', coordinator_address: str | None = None,
               num_processes: int | None = None, process_id: int | None = None,
               timeout: int = 300, heartbeat_timeout: int = 100) -> bool:
  """Starts JAX's distributed runtime when `settings` asks for it; True if it did.

  A process that is not connected to all others within `timeout` seconds exits with status 1
  and a message that names the coordinator address and what to check.
  """
  if timeout < 1:
    raise errors.ConfigError(f'--distributed_timeout={timeout} must be at least 1 second.')
  if heartbeat_timeout < 1:
    raise errors.ConfigError(f'--distributed_heartbeat_timeout={heartbeat_timeout} must be at '
                             'least 1 second.')
  config = settings(mode, coordinator_address, num_processes, process_id)
  if config is None:
    return False
  if jax.config.jax_cpu_collectives_implementation in (None, 'none'):  # Older JAX's default.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  watchdog = threading.Timer(timeout, exit_at_once, args=(_timeout_message(config, timeout),))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(coordinator_address=config.coordinator_address,
                               num_processes=config.num_processes,
                               process_id=config.process_id,
                               initialization_timeout=timeout,
                               heartbeat_timeout_seconds=heartbeat_timeout)
  except ValueError as error:  # Nothing detected to fill in what is missing.
    raise errors.ConfigError(
        f'JAX could not complete the distributed settings (from {config.source}): {error} '
        'Pass --coordinator_address, --num_processes and --process_id, or start the processes '
        'with a launcher JAX detects (Slurm, Open MPI, Cloud TPU, Kubernetes).') from error
  finally:
    watchdog.cancel()
  global _roll_call_seconds
  _roll_call_seconds = min(ROLL_CALL_SECONDS, heartbeat_timeout / 4)
  devices = jax.devices()
  per_process = collections.Counter(device.process_index for device in devices)
  progress.log(
      f'Distributed run: process {jax.process_index()} of {jax.process_count()}, '
      f'{jax.local_device_count()} local of {len(devices)} {devices[0].platform} device(s) '
      f'(per process: {", ".join(str(per_process[i]) for i in sorted(per_process))}); '
      f'settings from {config.source}.')
  return True


def allgather_texts(texts: list[str]) -> list[str]:
  """Every process's `texts`, concatenated in process order; the same list on every process.

  All processes must call it together (it runs collectives), with lists of any lengths.
  """
  if jax.process_count() == 1:
    return list(texts)
  encoded = [text.encode('utf-8') for text in texts]
  counts = multihost_utils.process_allgather(np.int32(len(encoded)))
  rows = max(int(counts.max()), 1)
  lengths = np.zeros(rows, np.int32)
  lengths[:len(encoded)] = [len(b) for b in encoded]
  all_lengths = multihost_utils.process_allgather(lengths)  # (processes, rows)
  buffer = np.zeros((rows, max(int(all_lengths.max()), 1)), np.uint8)
  for row, data in enumerate(encoded):
    buffer[row, :len(data)] = np.frombuffer(data, np.uint8)
  gathered = multihost_utils.process_allgather(buffer)  # (processes, rows, width)
  return [gathered[p, row, :all_lengths[p, row]].tobytes().decode('utf-8')
          for p in range(len(counts)) for row in range(int(counts[p]))]


def first_n_share(local_count: int, n: int) -> int:
  """How many of this process's items are among the first `n` of all processes' in order.

  All processes must call it together.
  """
  counts = multihost_utils.process_allgather(np.int32(local_count))
  before = int(np.sum(counts[:jax.process_index()]))
  return max(0, min(local_count, n - before))


_ROLL_CALL = 'vit_jax/alive/'  # Keys the surviving processes set after a failed collective.
ROLL_CALL_SECONDS = 5.0  # How long the survivors wait for each other's answer, at most.
# JAX's heartbeat may declare a lost process dead from about half its timeout after the loss,
# and then ends every survivor with a stack dump: the roll call ends well before that.
_roll_call_seconds = ROLL_CALL_SECONDS


def _client():
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  return jax_distributed.global_state.client


def lost_processes(wait: float | None = None) -> list[int]:
  """The processes that do not answer a roll call in the coordinator's key-value store.

  Every survivor of a failed collective writes its key and waits for the others' (`wait`
  seconds; by default ROLL_CALL_SECONDS, or a quarter of the heartbeat's timeout where that is
  less); when the coordinator itself is gone (process 0), nobody can answer.
  """
  wait = _roll_call_seconds if wait is None else wait
  client, count = _client(), jax.process_count()
  try:
    client.key_value_set(f'{_ROLL_CALL}{jax.process_index()}', 'alive')
    deadline = time.monotonic() + wait
    while True:
      present = {int(key.rsplit('/', 1)[-1]) for key, _ in client.key_value_dir_get(_ROLL_CALL)}
      if len(present) == count or time.monotonic() > deadline:
        return sorted(set(range(count)) - present)
      time.sleep(0.2)
  except Exception:  # pylint: disable=broad-except
    return [0]  # The coordinator, which process 0 hosts, does not answer.


def exit_lost_process(error: BaseException, resume: str) -> NoReturn:
  """After a collective failed: one line naming the lost process(es), then exit 1 at once.

  JAX's own shutdown would wait for the lost process and abort with a stack dump.
  """
  lost = lost_processes()
  count = jax.process_count()
  who = (f'process {", ".join(map(str, lost))} of {count} ' +
         ('is' if len(lost) == 1 else 'are') + ' lost' if lost else
         f'a process of the {count} failed')
  reason = ' '.join(str(error).split())[:300]
  exit_at_once(f'Process {jax.process_index()}: {who} (the collective failed: {reason}). '
               f'Restart every process of the job with the same command; {resume}')
