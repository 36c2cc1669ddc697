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

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from distributed_helpers import REPO, cpu_env, finish, free_port, start
from helpers import read_metrics

from vit_jax.train import config as config_lib

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('distributed')

TESTS = os.path.join(REPO, 'tests')


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


def _config_file(directory, name: str) -> str:
  path = os.path.join(directory, f'{name}.py')
  with open(path, 'w') as f:
    f.write(f'import sys\nsys.path.insert(0, {TESTS!r})\n'
            f'from test_distributed import {name} as get_config\n')
  return path


def _start_pair(directory, config_name: str, workdir: str, with_flags: bool, *flags: str,
                devices: int = 4):
  """Two `vit_jax.main` processes with `devices` CPU devices each; settings by flags or env."""
  address = f'127.0.0.1:{free_port()}'
  command = [sys.executable, '-m', 'vit_jax.main',
             f'--config={_config_file(directory, config_name)}', f'--workdir={workdir}', *flags]
  processes = []
  for process_id in range(2):
    if with_flags:
      processes.append(start(command + [f'--coordinator_address={address}', '--num_processes=2',
                                        f'--process_id={process_id}'], cpu_env(devices)))
    else:
      processes.append(start(command, cpu_env(devices, JAX_COORDINATOR_ADDRESS=address,
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
  return start([sys.executable, '-c', REFERENCE_SCRIPT, TESTS, 'finetune', npz, from_npz,
                from_workdir], cpu_env(1))


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
      'reference': [start([sys.executable, '-c', REFERENCE_SCRIPT, TESTS, workdirs['vit_one'],
                           workdirs['dates_one']], cpu_env(8))],
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
    finish(*started['vit'])
    started['evaluate'] = [start([sys.executable, '-m', 'vit_jax.main',
                                  f'--workdir={workdirs["vit"]}', '--config.trainer=evaluate'],
                                 cpu_env(1))]
  return started['evaluate'][0]


def _losses(workdir: str) -> list[float]:
  return [row['loss'] for row in read_metrics(workdir, 'train')]


def _finetune_from_workdir(runs) -> list[subprocess.Popen]:
  """The two-process fine-tune from the two-process .npz fine-tune's workdir, started once
  that run has ended (the reference fine-tunes from its own)."""
  started, workdirs = runs
  if 'workdir_two' not in started:
    finish(*started['npz_two'])
    started['workdir_two'] = _finetune_pair(workdirs['root'], workdirs['npz_two'],
                                            workdirs['workdir_two'])
  return started['workdir_two']


def test_fine_tuning_from_a_published_npz_on_a_sharded_two_process_mesh(runs):
  started, workdirs = runs
  out, _ = finish(*started['npz_two'])
  _finetune_from_workdir(runs)  # Overlaps the reference run.
  assert 'Distributed run: process 0 of 2, 2 local of 4 cpu device(s)' in out
  assert 'mesh data 1, fsdp 2, model 2' in out
  assert f'Loading pretrained weights from {workdirs["npz"]}' in out
  finish(*started['finetune_one'])
  two, one = _losses(workdirs['npz_two']), _losses(workdirs['npz_one'])
  assert len(two) == 2
  assert abs(two[0] - np.log(10)) > 0.1  # The file's head answers (a fresh one: log 10).
  np.testing.assert_allclose(two, one, rtol=1e-5)  # The first step's loss, and the second's.


def test_fine_tuning_from_a_workdir_on_a_sharded_two_process_mesh(runs):
  started, workdirs = runs
  out, _ = finish(*_finetune_from_workdir(runs))
  finish(*started['finetune_one'])
  assert f'Loading pretrained weights from {workdirs["npz_two"]}' in out
  two, one = _losses(workdirs['workdir_two']), _losses(workdirs['workdir_one'])
  assert len(two) == 2
  np.testing.assert_allclose(two, one, rtol=1e-5)  # The first step's loss, and the second's.
  # It starts from the .npz fine-tune's weights after its 2 steps (not a resumed run).
  assert not np.allclose(two[0], _losses(workdirs['npz_two'])[0], rtol=1e-3)


def test_two_processes_train_like_one_with_all_devices(runs):
  started, workdirs = runs
  out, _ = finish(*started['vit'])
  assert 'Distributed run: process 0 of 2, 4 local of 8 cpu device(s)' in out
  _evaluation(runs)  # Overlaps the reference run.
  finish(*started['reference'])
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
  [out] = finish(_evaluation(runs))
  [trained] = read_metrics(workdirs['vit'], 'test')  # Evaluate prints; the run's rows stay.
  evaluated = re.search(r'eval of step (\d+): accuracy (\S+)  loss (\S+)', out)
  assert evaluated, out
  assert int(evaluated[1]) == trained['step'] == 6
  assert evaluated[2] == f'{trained["accuracy"]:.4f}'
  assert evaluated[3] == f'{trained["loss"]:.4f}'


def test_translation_on_two_processes_scores_all_decoded_sentences(runs):
  started, workdirs = runs
  out, _ = finish(*started['dates'])
  assert 'settings from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID' in out
  finish(*started['reference'])
  np.testing.assert_allclose(_losses(workdirs['dates']), _losses(workdirs['dates_one']),
                             rtol=1e-5)
  [two], [one] = read_metrics(workdirs['dates'], 'test'), read_metrics(workdirs['dates_one'],
                                                                       'test')
  assert two['num_decoded'] == one['num_decoded'] == 7
  assert two['bleu'] == pytest.approx(one['bleu'], abs=1e-6)
  assert two['exact_match'] == pytest.approx(one['exact_match'], abs=1e-6)
