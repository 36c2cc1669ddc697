"""Two processes on localhost train, and fine-tune on a sharded mesh, like one process.

Every run is a subprocess with CPU devices (XLA_FLAGS). The two-process runs start
together (fixture `runs`) and write into one workdir. Kept free of `vit_jax.main`
imports: the workers load their configs from this module.

Which examples make a global batch: image hosts read contiguous shards of the train split
and shuffle and augment with per-host seeds, so two processes do not see the batches that one
process sees. The one-process image reference is therefore fed each step's two host batches
concatenated (`TwoHostBatches`). Translation hosts take interleaved shares (host i: examples
i, i + 2, ...), so without shuffling and packing a two-host batch holds the same examples as
a one-host batch, and the reference is a plain run.

The fine-tunes run on FINETUNE_MESH over two processes of 2 devices, so that each process holds
only its half of the FSDP-split weights: first from a published-layout .npz, then from the
workdir that this writes; their reference fine-tunes from the .npz and then from its own.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers import read_metrics, user_error

from vit_jax.train import config as config_lib
from vit_jax.train import distributed

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('distributed')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, 'tests')
TIMEOUT = 300  # Seconds; a guard against hangs, far above what a run takes.


def vit_config():
  config = config_lib.classification_config('ViT-testing')
  config.model.patch_size = (4, 4)  # 8x8 digits -> 4 patches.
  config.model.num_layers = 1
  config.model.dropout_rate = 0.0
  config.data.dataset = 'digits'
  config.data.image_size = 8
  config.batch_size = 32
  config.eval_batch_size = 360  # The whole test split in one batch.
  config.total_steps = 6
  config.log_every = 1
  config.eval_every = 0
  config.checkpoint_every = 0
  return config


def finetune_config():
  """`vit_config` fine-tuned for 2 steps; the mesh and the weights come from the command line."""
  config = vit_config()
  config.fsdp_min_size = 64  # So that most arrays are split over fsdp, across the hosts.
  config.total_steps = 2
  return config


FINETUNE_MESH = '(1, 2, 2)'  # 2 processes x 2 devices: fsdp spans the hosts, model does not.


def dates_config():
  config = config_lib.translation_config('Transformer-testing')
  config.model.num_layers = 1
  config.model.dropout_rate = 0.0
  config.data.dataset = 'dates'
  config.data.max_length = 32
  config.data.dates_train_size = 400
  config.data.dates_test_size = 10
  config.data.shuffle_buffer = 1  # No shuffling and no packing: see the module docstring.
  config.data.pack = False
  config.batch_size = 32
  config.eval_batch_size = 16
  config.total_steps = 6
  config.optimizer.name = 'adamw'
  config.optimizer.schedule = 'constant'
  config.optimizer.warmup_steps = 0
  config.optimizer.learning_rate = 3e-3
  config.beam_size = 1
  config.max_decode_length = 12
  config.num_eval_decode = 7  # Host 0 decodes its 5 test sentences, host 1 two of its 5.
  config.log_every = 1
  config.eval_every = 0
  config.checkpoint_every = 0
  return config


REFERENCE_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import test_distributed as t
    from vit_jax import main
    from vit_jax.data import images
    from vit_jax.train import classification, loop

    class TwoHostBatches(classification.ClassificationTask):
      """Each global batch as two processes make it: host 0's batch, then host 1's."""

      def train_batches(self, start_step):
        streams = [images.build(self.config.data, process_index=i, process_count=2)
                   .train_batches(self.config.batch_size // 2, seed=self.config.seed,
                                  start_step=start_step) for i in range(2)]
        for parts in zip(*streams):
          yield {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

    if sys.argv[2] == 'finetune':  # From the .npz into a workdir, then from that workdir.
      for pretrained, workdir in [(sys.argv[3], sys.argv[4]), (sys.argv[4], sys.argv[5])]:
        config = t.finetune_config()
        config.pretrained = pretrained
        loop.train(config, workdir, TwoHostBatches(config, workdir))
    else:
      config = t.vit_config()
      loop.train(config, sys.argv[2], TwoHostBatches(config, sys.argv[2]))
      main.run(t.dates_config(), sys.argv[3])
''')


def _env(devices: int, **variables) -> dict:
  """This environment without launcher or JAX_* settings, with `devices` CPU devices.

  The run's compilation cache and XLA options (conftest.py) stay.
  """
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('SLURM_', 'OMPI_', 'JAX_'))
         or k.startswith(('JAX_COMPILATION_CACHE_', 'JAX_PERSISTENT_CACHE_'))}
  xla_flags = [flag for flag in env.get('XLA_FLAGS', '').split() if 'device_count' not in flag]
  return {**env, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ' '.join(
      [*xla_flags, f'--xla_force_host_platform_device_count={devices}']), **variables}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _start(args, env) -> subprocess.Popen:
  return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def _config_file(directory, name: str) -> str:
  path = os.path.join(directory, f'{name}.py')
  with open(path, 'w') as f:
    f.write(f'import sys\nsys.path.insert(0, {TESTS!r})\n'
            f'from test_distributed import {name} as get_config\n')
  return path


def _start_pair(directory, config_name: str, workdir: str, with_flags: bool, *flags: str,
                devices: int = 4):
  """Two `vit_jax.main` processes with `devices` CPU devices each; settings by flags or env."""
  address = f'127.0.0.1:{_free_port()}'
  command = [sys.executable, '-m', 'vit_jax.main',
             f'--config={_config_file(directory, config_name)}', f'--workdir={workdir}', *flags]
  processes = []
  for process_id in range(2):
    if with_flags:
      processes.append(_start(command + [f'--coordinator_address={address}', '--num_processes=2',
                                         f'--process_id={process_id}'], _env(devices)))
    else:
      processes.append(_start(command, _env(devices, JAX_COORDINATOR_ADDRESS=address,
                                            JAX_NUM_PROCESSES='2',
                                            JAX_PROCESS_ID=str(process_id))))
  return processes


def _write_published_npz(path: str):
  """Random weights of the fine-tuned model in the published layout, as trained elsewhere at
  16x16 pixels (a 4x4 patch grid, where digits have 2x2)."""
  from weights_helpers import _random_params  # pylint: disable=g-import-not-at-top
  from vit_jax import weights  # pylint: disable=g-import-not-at-top
  weights.save_npz(path, _random_params('ViT-testing', num_classes=10, size=16,
                                        patch_size=(4, 4), num_layers=1))


def _finetune_pair(root, pretrained: str, workdir: str, *flags: str):
  """`finetune_config` on two processes of 2 devices, on FINETUNE_MESH, from `pretrained`."""
  return _start_pair(root, 'finetune_config', workdir, True, f'--config.pretrained={pretrained}',
                     f'--config.mesh_shape={FINETUNE_MESH}', *flags, devices=2)


def _finetune_references(npz: str, from_npz: str, from_workdir: str):
  """The fine-tunes on one process with one device, fed the two hosts' batches: from `npz`
  into `from_npz`, then from that workdir into `from_workdir`."""
  return _start([sys.executable, '-c', REFERENCE_SCRIPT, TESTS, 'finetune', npz, from_npz,
                 from_workdir], _env(1))


def _finish(*processes) -> list[str]:
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


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Starts the two-process image and translation runs and the one-process references."""
  root = tmp_path_factory.mktemp('distributed')
  workdirs = {name: str(root / name) for name in (
      'vit', 'dates', 'vit_one', 'dates_one', 'npz_two', 'npz_one', 'workdir_two',
      'workdir_one')}
  workdirs['npz'], workdirs['root'] = str(root / 'ViT-testing.npz'), str(root)
  _write_published_npz(workdirs['npz'])
  started = {
      'vit': _start_pair(root, 'vit_config', workdirs['vit'], with_flags=True),
      'dates': _start_pair(root, 'dates_config', workdirs['dates'], with_flags=False),
      'reference': [_start([sys.executable, '-c', REFERENCE_SCRIPT, TESTS, workdirs['vit_one'],
                            workdirs['dates_one']], _env(8))],
      'npz_two': _finetune_pair(root, workdirs['npz'], workdirs['npz_two']),
      'finetune_one': [_finetune_references(workdirs['npz'], workdirs['npz_one'],
                                            workdirs['workdir_one'])],
  }
  yield started, workdirs
  for processes in started.values():
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.communicate()


def _evaluation(runs) -> subprocess.Popen:
  """A one-process `trainer=evaluate` of the two-process image run, started once it ends."""
  started, workdirs = runs
  if 'evaluate' not in started:
    _finish(*started['vit'])
    started['evaluate'] = [_start([sys.executable, '-m', 'vit_jax.main',
                                   f'--workdir={workdirs["vit"]}', '--config.trainer=evaluate'],
                                  _env(1))]
  return started['evaluate'][0]


def _losses(workdir: str) -> list[float]:
  return [row['loss'] for row in read_metrics(workdir, 'train')]


def _finetune_from_workdir(runs) -> list[subprocess.Popen]:
  """The two-process fine-tune from the two-process .npz fine-tune's workdir, started once
  that run has ended (the reference fine-tunes from its own)."""
  started, workdirs = runs
  if 'workdir_two' not in started:
    _finish(*started['npz_two'])
    started['workdir_two'] = _finetune_pair(workdirs['root'], workdirs['npz_two'],
                                            workdirs['workdir_two'])
  return started['workdir_two']


def test_fine_tuning_from_a_published_npz_on_a_sharded_two_process_mesh(runs):
  started, workdirs = runs
  out, _ = _finish(*started['npz_two'])
  _finetune_from_workdir(runs)  # Overlaps the reference run.
  assert 'Distributed run: process 0 of 2, 2 local of 4 cpu device(s)' in out
  assert 'mesh data 1, fsdp 2, model 2' in out
  assert f'Loading pretrained weights from {workdirs["npz"]}' in out
  _finish(*started['finetune_one'])
  two, one = _losses(workdirs['npz_two']), _losses(workdirs['npz_one'])
  assert len(two) == 2
  assert abs(two[0] - np.log(10)) > 0.1  # The file's head answers (a fresh one: log 10).
  np.testing.assert_allclose(two, one, rtol=1e-5)  # The first step's loss, and the second's.


def test_fine_tuning_from_a_workdir_on_a_sharded_two_process_mesh(runs):
  started, workdirs = runs
  out, _ = _finish(*_finetune_from_workdir(runs))
  _finish(*started['finetune_one'])
  assert f'Loading pretrained weights from {workdirs["npz_two"]}' in out
  two, one = _losses(workdirs['workdir_two']), _losses(workdirs['workdir_one'])
  assert len(two) == 2
  np.testing.assert_allclose(two, one, rtol=1e-5)  # The first step's loss, and the second's.
  # It starts from the .npz fine-tune's weights after its 2 steps (not a resumed run).
  assert not np.allclose(two[0], _losses(workdirs['npz_two'])[0], rtol=1e-3)


def test_two_processes_train_like_one_with_all_devices(runs):
  started, workdirs = runs
  out, _ = _finish(*started['vit'])
  assert 'Distributed run: process 0 of 2, 4 local of 8 cpu device(s)' in out
  _evaluation(runs)  # Overlaps the reference run.
  _finish(*started['reference'])
  two, one = _losses(workdirs['vit']), _losses(workdirs['vit_one'])
  assert len(two) == 6  # Process 1 writes no metrics of its own.
  np.testing.assert_allclose(two, one, rtol=1e-5)
  test_two = read_metrics(workdirs['vit'], 'test')[0]  # Then the evaluation's row.
  [test_one] = read_metrics(workdirs['vit_one'], 'test')
  assert test_two['num_examples'] == 360  # Each host evaluated its half of the test split.
  assert test_two['accuracy'] == test_one['accuracy']
  assert test_two['loss'] == pytest.approx(test_one['loss'], rel=1e-5)


def test_checkpoint_of_two_processes_evaluates_in_one(runs):
  _, workdirs = runs
  [out] = _finish(_evaluation(runs))
  [trained] = read_metrics(workdirs['vit'], 'test')  # Evaluate prints; the run's rows stay.
  evaluated = re.search(r'eval of step (\d+): accuracy (\S+)  loss (\S+)', out)
  assert evaluated, out
  assert int(evaluated[1]) == trained['step'] == 6
  assert evaluated[2] == f'{trained["accuracy"]:.4f}'
  assert evaluated[3] == f'{trained["loss"]:.4f}'


def test_translation_on_two_processes_scores_all_decoded_sentences(runs):
  started, workdirs = runs
  out, _ = _finish(*started['dates'])
  assert 'settings from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID' in out
  _finish(*started['reference'])
  np.testing.assert_allclose(_losses(workdirs['dates']), _losses(workdirs['dates_one']),
                             rtol=1e-5)
  [two], [one] = read_metrics(workdirs['dates'], 'test'), read_metrics(workdirs['dates_one'],
                                                                       'test')
  assert two['num_decoded'] == one['num_decoded'] == 7
  assert two['bleu'] == pytest.approx(one['bleu'], abs=1e-6)
  assert two['exact_match'] == pytest.approx(one['exact_match'], abs=1e-6)


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
  address = f'127.0.0.1:{_free_port()}'
  processes = [_start([sys.executable, '-c', GATHER_SCRIPT, address, str(i)], _env(1))
               for i in range(2)]
  results = [json.loads(out.splitlines()[-1]) for out in _finish(*processes)]
  for result in results:
    assert result['texts'] == ['héllo', '', 'a b', 'ünï', 'x' * 300]
    assert result['empty'] == ['z']
  assert [r['share'] for r in results] == [3, 1]  # The first 4 of 3 + 2 texts.


def test_unreachable_coordinator_fails_within_the_timeout(tmp_path):
  address = f'127.0.0.1:{_free_port()}'  # Nothing listens there.
  start = time.monotonic()
  process = _start([sys.executable, '-m', 'vit_jax.main',
                    f'--config={_config_file(tmp_path, "vit_config")}',
                    f'--workdir={tmp_path / "run"}', f'--coordinator_address={address}',
                    '--num_processes=2', '--process_id=1', '--distributed_timeout=3'], _env(1))
  try:
    _, err = process.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    process.kill()
    pytest.fail('An unreachable coordinator hung the process.')
  assert process.returncode == 1
  assert time.monotonic() - start < 40
  assert f'could not register with the coordinator at {address}' in err
  assert '--distributed_timeout=3s' in err and 'Check that process 0 is running' in err
  assert not os.path.exists(tmp_path / 'run')


def test_a_lost_process_is_named_by_the_others(tmp_path):
  """Process 1 killed mid-training: process 0 exits in one line naming it, within seconds."""
  address = f'127.0.0.1:{_free_port()}'
  command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/vit_digits.py',
             f'--workdir={tmp_path / "run"}', '--config.total_steps=100000',
             '--config.log_every=5', f'--coordinator_address={address}', '--num_processes=2',
             '--distributed_heartbeat_timeout=10']
  first, second = (_start(command + [f'--process_id={i}'], _env(1)) for i in range(2))
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
