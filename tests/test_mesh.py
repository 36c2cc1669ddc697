"""Meshes over (data, fsdp, model): data-parallel, FSDP and tensor-parallel runs agree, a
checkpoint moves between meshes and device counts, devices are laid out by their topology
(TPU slices and hosts as mesh_utils builds them), and mistakes get clear errors."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from helpers import read_metrics
from test_train import tiny_config as vit_config
from test_translation import tiny_config as mt_config

from vit_jax import main
from vit_jax.train import checkpointing

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('mesh')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 4 heads so that the model axis can be 4; wide enough that FSDP splits the dense kernels.
VIT = {'total_steps': 5, 'log_every': 1, 'eval_every': 0, 'checkpoint_every': 0,
       'model.hidden_size': 64, 'model.mlp_dim': 128, 'model.num_heads': 4}
MT = {'total_steps': 4, 'log_every': 1, 'num_eval_decode': 4}
VIT_MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]  # Data parallel, all three axes, FSDP + TP 4.
MT_MESHES = [(8, 1, 1), (1, 2, 4)]

EIGHT_DEVICES = textwrap.dedent('''
    import json, os, shutil, sys
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                               + ' --xla_force_host_platform_device_count=8')
    repo, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(repo, 'tests'))
    import jax, numpy as np
    from helpers import read_metrics
    from test_mesh import VIT, MT, VIT_MESHES, MT_MESHES
    from test_train import tiny_config as vit_config
    from test_translation import tiny_config as mt_config
    from vit_jax import main
    from vit_jax.train import checkpointing, classification, loop, mesh as mesh_lib, optim

    def losses(workdir):
      return [row['loss'] for row in read_metrics(workdir, 'train')]

    results = {'vit': {}, 'mt': {}}
    for shape in VIT_MESHES:
      workdir = os.path.join(out, 'vit', str(shape))
      main.run(vit_config(mesh_shape=shape, **VIT), workdir)
      results['vit'][str(shape)] = losses(workdir)
    for shape in MT_MESHES:
      workdir = os.path.join(out, 'mt', str(shape))
      main.run(mt_config(mesh_shape=shape, **MT), workdir)
      results['mt'][str(shape)] = losses(workdir)

    # How the (2, 2, 2) mesh splits the parameters.
    config = vit_config(mesh_shape=(2, 2, 2), **VIT)
    task = classification.ClassificationTask(config, out)
    tx, _ = optim.make_optimizer(config.optimizer, config.total_steps)
    mesh = mesh_lib.make_mesh(config.mesh_shape)
    _, shardings = loop.abstract_state(task, tx, mesh, config)
    block = shardings['params']['Transformer']['encoderblock_0']
    results['specs'] = {
        name: str(tuple(sharding.spec)) for name, sharding in [
            ('query', block['MultiHeadDotProductAttention_1']['query']['kernel']),
            ('out', block['MultiHeadDotProductAttention_1']['out']['kernel']),
            ('mlp_in', block['MlpBlock_3']['Dense_0']['kernel']),
            ('mlp_out', block['MlpBlock_3']['Dense_1']['kernel']),
            ('cls', shardings['params']['cls'])]}

    # The checkpoint of the (8, 1, 1) run restores on a (2, 2, 2) mesh with equal values...
    saved = os.path.join(out, 'vit', str((8, 1, 1)))
    states = {}
    for shape in [(8, 1, 1), (2, 2, 2)]:
      config = vit_config(mesh_shape=shape, **VIT)
      mesh = mesh_lib.make_mesh(shape)
      target, _ = loop.abstract_state(task, tx, mesh, config)
      _, states[shape] = checkpointing.Checkpointer(saved).restore(target)
    flat = lambda state: [np.asarray(x) for x in jax.tree.leaves(state)]
    results['restored_equal'] = all(np.array_equal(a, b) for a, b in zip(
        flat(states[(8, 1, 1)]), flat(states[(2, 2, 2)])))
    kernel = states[(2, 2, 2)]['params']['Transformer']['encoderblock_0']['MlpBlock_3']
    results['restored_spec'] = str(tuple(kernel['Dense_0']['kernel'].sharding.spec))
    np.savez(os.path.join(out, 'saved_params.npz'),
             *[np.asarray(x) for x in jax.tree.leaves(states[(8, 1, 1)]['params'])])
    shutil.copytree(saved, os.path.join(out, 'for_one_device'))
    # ... and training continues there.
    workdir = os.path.join(out, 'continued')
    shutil.copytree(saved, workdir)
    main.run(vit_config(mesh_shape=(2, 2, 2), **{**VIT, 'total_steps': 8}), workdir)
    results['continued'] = losses(workdir)[5:]

    # The 8 CPU devices are laid out as mesh_utils lays them out.
    from jax.experimental import mesh_utils
    ids = np.vectorize(lambda device: device.id)
    results['grids'] = {str(shape): [ids(mesh_lib.make_mesh(shape).devices).tolist(),
                                     ids(mesh_utils.create_device_mesh(shape)).tolist()]
                        for shape in VIT_MESHES}

    errors = {}
    for name, overrides in [('mesh', {'mesh_shape': (2, 2, 1)}),
                            ('divisible', {'mesh_shape': (1, 1, 8)}),
                            ('minus_one', {'mesh_shape': (3, -1, 1)}),
                            ('batch', {'batch_size': 36})]:
      try:
        main.run(vit_config(**{**VIT, **overrides}), os.path.join(out, 'errors', name))
      except ValueError as error:
        errors[name] = str(error)
    results['errors'] = errors
    print(json.dumps(results))
''')


@pytest.fixture(scope='module')
def eight_devices(tmp_path_factory):
  """Runs every multi-device case once in a subprocess with 8 CPU devices."""
  out = tmp_path_factory.mktemp('mesh')
  script = out / 'eight_devices.py'
  script.write_text(EIGHT_DEVICES)
  run = subprocess.run([sys.executable, str(script), REPO, str(out)], capture_output=True,
                       text=True, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1]), out


def test_vit_meshes_match_one_device(eight_devices, tmp_path):
  results, _ = eight_devices
  main.run(vit_config(**VIT), str(tmp_path))  # This process has one CPU device.
  one = [row['loss'] for row in read_metrics(str(tmp_path), 'train')]
  assert len(one) == 5
  data_parallel = results['vit'][str((8, 1, 1))]
  np.testing.assert_allclose(data_parallel, one, rtol=1e-5)
  for shape in VIT_MESHES[1:]:
    np.testing.assert_allclose(results['vit'][str(shape)], data_parallel, rtol=1e-5,
                               err_msg=f'mesh {shape}')


def test_transformer_meshes_match_one_device(eight_devices, tmp_path):
  results, _ = eight_devices
  main.run(mt_config(**MT), str(tmp_path))
  one = [row['loss'] for row in read_metrics(str(tmp_path), 'train')]
  data_parallel = results['mt'][str((8, 1, 1))]
  np.testing.assert_allclose(data_parallel, one, rtol=1e-5)
  np.testing.assert_allclose(results['mt'][str((1, 2, 4))], data_parallel, rtol=1e-5)


def test_parameters_split_over_heads_mlp_units_and_fsdp(eight_devices):
  specs = eight_devices[0]['specs']
  # q/k/v kernels (embed, heads, head_dim): heads over 'model', embed over 'fsdp'.
  assert specs['query'] == "('fsdp', 'model', None)"
  assert specs['out'] == "('model', None, 'fsdp')"  # (heads, head_dim, embed)
  assert specs['mlp_in'] == "('fsdp', 'model')"  # (embed, mlp)
  assert specs['mlp_out'] == "('model', 'fsdp')"  # (mlp, embed)
  assert specs['cls'] == '()'  # 64 numbers: not worth splitting.


def test_checkpoint_moves_between_meshes_and_device_counts(eight_devices, tmp_path):
  results, out = eight_devices
  assert results['restored_equal']
  assert results['restored_spec'] == "('fsdp', 'model')"
  continued = results['continued']
  assert len(continued) == 3  # Steps 6, 7 and 8 after resuming at step 5 on (2, 2, 2).

  # On one device (this process): the same values, and training continues the same way.
  workdir = str(tmp_path / 'one_device')
  shutil.copytree(out / 'for_one_device', workdir)
  params, _ = checkpointing.Checkpointer(workdir).restore_params()
  saved = np.load(out / 'saved_params.npz')
  leaves = jax.tree.leaves(params)
  assert len(leaves) == len(saved.files)
  assert all(np.array_equal(leaf, saved[f'arr_{i}']) for i, leaf in enumerate(leaves))
  main.run(vit_config(**{**VIT, 'total_steps': 8}), workdir)
  np.testing.assert_allclose([row['loss'] for row in read_metrics(workdir, 'train')][5:],
                             continued, rtol=1e-4)


def test_mesh_of_eight_cpu_devices_is_what_mesh_utils_builds(eight_devices):
  for shape, (ours, mesh_utils_grid) in eight_devices[0]['grids'].items():
    assert np.array(ours).shape == eval(shape)  # pylint: disable=eval-used
    assert ours == mesh_utils_grid, shape


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  """What mesh_utils reads of a device (TPU: its chip's coordinates and core)."""
  id: int
  process_index: int
  slice_index: int = 0
  coords: tuple[int, int, int] = (0, 0, 0)
  core_on_chip: int = 0
  platform: str = 'tpu'
  device_kind: str = 'TPU v4'


def _two_tpu_slices():
  """Two 2x2x2 TPU v4 slices of two hosts each, listed in a scrambled order."""
  devices = [FakeDevice(8 * s + 4 * z + 2 * y + x, 2 * s + z, s, (x, y, z))
             for s in range(2) for z in range(2) for y in range(2) for x in range(2)]
  return [devices[i] for i in np.random.default_rng(0).permutation(len(devices))]


def _attr(grid, name):
  return np.vectorize(lambda device: getattr(device, name))(grid)


@pytest.mark.parametrize('shape, ici, dcn', [
    ((-1, 2, 4), (1, 2, 4), (2, 1, 1)),  # 'data' spans the slices...
    ((1, 4, 4), (1, 2, 4), (1, 2, 1)),  # ... or, where it is 1, 'fsdp'.
    ((4, 2, 2), (2, 2, 2), (2, 1, 1)),
])
def test_mesh_over_tpu_slices_keeps_model_groups_in_one_slice(shape, ici, dcn):
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  from vit_jax.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  devices = _two_tpu_slices()
  grid = mesh_lib.make_mesh(shape, devices).devices
  expected = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
  np.testing.assert_array_equal(_attr(grid, 'id'), _attr(expected, 'id'))
  slices = _attr(grid, 'slice_index')
  assert (slices == slices[..., :1]).all()  # Each model group lies in one slice.
  data, fsdp, model = grid.shape  # The slices split 'data' first, then 'fsdp'.
  np.testing.assert_array_equal(slices, np.broadcast_to(
      np.arange(data)[:, None, None] * dcn[0] // data * dcn[1]
      + np.arange(fsdp)[None, :, None] * dcn[1] // fsdp, grid.shape))
  # Within a slice (a 2x2x2 cube of chips), a model group is a face (4) or an edge (2).
  for group in grid.reshape(-1, model):
    assert (np.ptp([device.coords for device in group], axis=0) > 0).sum() == model // 2
  # Laid out in list order, as before, model groups would span the slices.
  naive = _attr(np.asarray(devices).reshape(grid.shape), 'slice_index')
  assert not (naive == naive[..., :1]).all()


def test_mesh_over_processes_is_the_hybrid_mesh_of_their_devices():
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  from vit_jax.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  devices = [FakeDevice(i, i // 4, platform='cpu', device_kind='cpu') for i in range(8)]
  grid = mesh_lib.make_mesh((1, 2, 4), devices).devices
  expected = mesh_utils.create_hybrid_device_mesh((1, 1, 4), (1, 2, 1), devices,
                                                  process_is_granule=True)
  np.testing.assert_array_equal(_attr(grid, 'id'), _attr(expected, 'id'))
  np.testing.assert_array_equal(_attr(grid, 'process_index'), [[[0] * 4, [1] * 4]])


@pytest.mark.parametrize('devices, shape, message', [
    (_two_tpu_slices(), (1, 1, 16), 'config.mesh_shape=(1, 1, 16): the model axis (16) must '
     'divide the 8 devices of each slice, so that a model group never spans TPU slices.'),
    ([FakeDevice(i, i // 4, platform='cpu', device_kind='cpu') for i in range(8)], (1, 1, 8),
     'config.mesh_shape=(1, 1, 8): the model axis (8) must divide the 4 devices of each '
     'process, so that a model group never spans hosts.'),
    ([FakeDevice(i, int(i >= 3), platform='cpu', device_kind='cpu') for i in range(8)],
     (-1, 1, 1), 'config.mesh_shape=(-1, 1, 1): the processes (2) have different '
     'device counts ([3, 5]); give every process the same number of devices.'),
])
def test_mesh_across_slices_and_hosts_errors(devices, shape, message):
  from vit_jax.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError) as error:
    mesh_lib.make_mesh(shape, devices)
  assert str(error.value) == message


def test_mesh_errors_name_the_problem(eight_devices):
  errors = eight_devices[0]['errors']
  assert errors['mesh'].startswith('config.mesh_shape=(2, 2, 1) needs 4 devices, but there '
                                   'are 8')
  assert 'Parameter Transformer/encoderblock_0/MultiHeadDotProductAttention_1/' in (
      errors['divisible'])
  assert "('heads', size 4) is not divisible by the 'model' mesh axis (8)" in errors['divisible']
  assert errors['minus_one'].startswith('config.mesh_shape=(3, -1, 1): 8 devices do not split '
                                        'into groups of 3')
  assert errors['batch'].startswith('batch_size=36 is not divisible by the 8 batch shards')


def test_parameters_carry_logical_axes_only_when_asked():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.models import partitioning  # pylint: disable=g-import-not-at-top
  model = models.get_model('ViT-testing', num_classes=3, scan_layers=True)
  images = np.zeros((1, 8, 8, 3), np.float32)
  plain = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))['params']
  assert not any(isinstance(x, nn.LogicallyPartitioned) for x in jax.tree.leaves(
      plain, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)))
  with partitioning.boxed():
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))['params']
  specs = nn.get_partition_spec(boxed)['Transformer']['encoderblock']
  # The scanned stack adds its layer axis in front.
  assert tuple(specs['MultiHeadDotProductAttention_1']['query']['kernel']) == (
      'layers', 'embed', 'heads', 'head_dim')
  assert tuple(specs['MlpBlock_3']['Dense_1']['kernel']) == ('layers', 'mlp', 'embed')
  assert tuple(specs['LayerNorm_0']['scale']) == ()
  assert jax.tree.structure(nn.meta.unbox(boxed)) == jax.tree.structure(plain)
