"""Starting a job of many processes: texts gathered from all of them, a coordinator that
cannot be reached, a process lost mid-training, and where the settings come from (flags,
JAX_* variables, Slurm). The processes are subprocesses on localhost with CPU devices."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from distributed_helpers import cpu_env, finish, free_port, start
from helpers import user_error

from vit_jax.train import distributed


GATHER_SCRIPT = textwrap.dedent('''
    import json, sys
    from vit_jax.train import distributed
    distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]), timeout=60)
    texts = [['héllo', '', 'a b'], ['ünï', 'x' * 300]][int(sys.argv[2])]
    print(json.dumps({'texts': distributed.allgather_texts(texts),
                      'share': distributed.first_n_share(len(texts), 4),
                      'empty': distributed.allgather_texts([] if sys.argv[2] == '0' else ['z'])}))
''')


def test_texts_are_gathered_from_all_processes_in_order():
  address = f'127.0.0.1:{free_port()}'
  processes = [start([sys.executable, '-c', GATHER_SCRIPT, address, str(i)], cpu_env(1))
               for i in range(2)]
  results = [json.loads(out.splitlines()[-1]) for out in finish(*processes)]
  for result in results:
    assert result['texts'] == ['héllo', '', 'a b', 'ünï', 'x' * 300]
    assert result['empty'] == ['z']
  assert [r['share'] for r in results] == [3, 1]  # The first 4 of 3 + 2 texts.


def test_unreachable_coordinator_fails_within_the_timeout(tmp_path):
  address = f'127.0.0.1:{free_port()}'  # Nothing listens there.
  began = time.monotonic()
  process = start([sys.executable, '-m', 'vit_jax.main', '--config=configs/vit_digits.py',
                   f'--workdir={tmp_path / "run"}', f'--coordinator_address={address}',
                   '--num_processes=2', '--process_id=1', '--distributed_timeout=3'], cpu_env(1))
  try:
    _, err = process.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    process.kill()
    pytest.fail('An unreachable coordinator hung the process.')
  assert process.returncode == 1
  assert time.monotonic() - began < 40
  assert f'could not register with the coordinator at {address}' in err
  assert '--distributed_timeout=3s' in err and 'Check that process 0 is running' in err
  assert not os.path.exists(tmp_path / 'run')


def test_a_lost_process_is_named_by_the_others(tmp_path):
  """Process 1 killed mid-training: process 0 exits in one line naming it, within seconds."""
  address = f'127.0.0.1:{free_port()}'
  command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/vit_digits.py',
             f'--workdir={tmp_path / "run"}', '--config.total_steps=100000',
             '--config.log_every=5', f'--coordinator_address={address}', '--num_processes=2',
             '--distributed_heartbeat_timeout=10']
  first, second = (start(command + [f'--process_id={i}'], cpu_env(1)) for i in range(2))
  try:
    for line in first.stdout:  # Until both train.
      if line.startswith('step 10/'):
        break
    second.kill()
    killed = time.monotonic()
    _, err = first.communicate(timeout=60)
    detected = time.monotonic() - killed
  finally:
    for process in (first, second):
      if process.poll() is None:
        process.kill()
      process.communicate()
  assert first.returncode == 1, err[-3000:]
  assert re.fullmatch(r'error: Process 0: process 1 of 2 is lost \(the collective failed: .+\)\. '
                      r'Restart every process of the job with the same command; it resumes '
                      r'from the last checkpoint; none was written yet\.', user_error(err)), err
  assert detected < 10 + distributed.ROLL_CALL_SECONDS, detected
  print(f'lost process detected and named in {detected:.1f} s')


# --- Where the settings come from (no processes started) ---------------------------------


def test_a_single_process_run_starts_nothing():
  assert distributed.settings(environ={}) is None
  assert distributed.settings(environ={'SLURM_JOB_ID': '1', 'SLURM_STEP_NODELIST': 'n1',
                                       'SLURM_PROCID': '0', 'SLURM_LOCALID': '0',
                                       'SLURM_NTASKS': '1'}) is None
  assert distributed.settings('off', environ={'JAX_NUM_PROCESSES': '2'}) is None


def test_settings_from_flags_environment_and_launcher():
  flags = distributed.settings('auto', '10.0.0.1:1234', 4, 3, environ={})
  assert flags == distributed.Settings('10.0.0.1:1234', 4, 3,
                                       '--coordinator_address, --num_processes, --process_id')
  env = {'JAX_COORDINATOR_ADDRESS': 'host:99', 'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '0'}
  assert distributed.settings(environ=env) == distributed.Settings(
      'host:99', 2, 0, 'JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID')
  assert distributed.settings(process_id=1, environ=env).process_id == 1  # Flags win.
  slurm = {'SLURM_JOB_ID': '7', 'SLURM_STEP_NODELIST': 'n[1-4]', 'SLURM_PROCID': '2',
           'SLURM_LOCALID': '0', 'SLURM_NTASKS': '4'}
  assert distributed.settings(environ=slurm) == distributed.Settings(
      None, None, None, 'Slurm (SLURM_NTASKS=4)')
  assert distributed.settings('on', environ={}).source == '--distributed=on'


@pytest.mark.parametrize('kwargs, environ, message', [
    ({'coordinator_address': 'h:1'}, {}, '--num_processes and --process_id'),
    ({}, {'JAX_NUM_PROCESSES': 'two'}, "JAX_NUM_PROCESSES='two' is not an integer"),
    ({'coordinator_address': 'h', 'num_processes': 2, 'process_id': 0}, {}, 'is not HOST:PORT'),
    ({'coordinator_address': 'h:99999', 'num_processes': 2, 'process_id': 0}, {},
     r"coordinator_address='h:99999': port 99999 is not a TCP port \(1 to 65535\); use a free "
     'port of process 0, e.g. h:1234'),  # It waited --distributed_timeout, saying nothing.
    ({'coordinator_address': 'h:1', 'num_processes': 2, 'process_id': 2}, {},
     r'process_id=2 must be in \[0, num_processes=2\)'),
    ({'mode': 'off', 'num_processes': 2}, {}, '--num_processes given with --distributed=off'),
])
def test_bad_settings_are_named(kwargs, environ, message):
  with pytest.raises(ValueError, match=message):
    distributed.settings(**kwargs, environ=environ)


@pytest.mark.parametrize('timeouts, message', [
    ({'timeout': 0}, r'--distributed_timeout=0 must be at least 1 second\.'),
    # JAX took it, and the run waited for the other processes.
    ({'heartbeat_timeout': -1}, r'--distributed_heartbeat_timeout=-1 must be at least 1 second\.')])
def test_timeouts_below_a_second_are_named_before_anything_starts(timeouts, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize('on', 'h:1', 2, 0, **timeouts)
