"""Processes on localhost for the multi-process tests (test_distributed, test_distributed_start):
their environment, a free port, starting them and waiting for them."""

import os
import socket
import subprocess

from helpers import REPO

TIMEOUT = 300  # Seconds; a guard against hangs, far above what a run takes.


def cpu_env(devices: int, **variables) -> dict:
  """This environment without launcher or JAX_* settings, with `devices` CPU devices.

  The run's compilation cache and XLA options (conftest.py) stay.
  """
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('SLURM_', 'OMPI_', 'JAX_'))
         or k.startswith(('JAX_COMPILATION_CACHE_', 'JAX_PERSISTENT_CACHE_'))}
  xla_flags = [flag for flag in env.get('XLA_FLAGS', '').split() if 'device_count' not in flag]
  return {**env, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ' '.join(
      [*xla_flags, f'--xla_force_host_platform_device_count={devices}']), **variables}


def free_port() -> int:
  """A TCP port of localhost that nothing listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start(args, env) -> subprocess.Popen:
  """`args` started in the repository's root, its stdout and stderr piped as text."""
  return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def finish(*processes) -> list[str]:
  """Stdout of each process (waited for once); fails with its stderr if one failed or hung."""
  for process in processes:
    if not hasattr(process, 'result'):
      try:
        process.result = process.communicate(timeout=TIMEOUT)
      except subprocess.TimeoutExpired:
        process.kill()
        process.result = process.communicate()
    assert process.returncode == 0, (f'{process.args} failed or hung (status '
                                     f'{process.returncode}); stderr:\n{process.result[1][-3000:]}')
  return [process.result[0] for process in processes]
