"""Device mesh and shardings over the axes ('data', 'fsdp', 'model').

Batches are split over data x fsdp. A parameter is split in two steps:
1. tensor parallelism: dimensions the modules annotate with a logical axis that
   `LOGICAL_AXIS_RULES` maps to 'model' (attention heads, MLP hidden units) are split
   over 'model', Megatron-style;
2. FSDP: the largest remaining dimension divisible by the 'fsdp' axis is split over
   'fsdp' (arrays under `fsdp_min_size` elements stay whole: splitting saves nothing).
Everything else is replicated. Optimizer state follows its parameter.
"""

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax import errors

MESH_AXES = ('data', 'fsdp', 'model')
BATCH_AXES = ('data', 'fsdp')  # The batch dimension is split over both.
# The modules' logical axis names -> mesh axis (None: never split by name).
LOGICAL_AXIS_RULES = (
    ('heads', 'model'),  # Attention heads: q/k/v kernels (embed, heads, head_dim), out kernel.
    ('mlp', 'model'),  # MLP hidden units: Dense_0 (embed, mlp), Dense_1 (mlp, embed).
    ('embed', None),
    ('head_dim', None),
    ('vocab', None),
    ('layers', None),  # The stacked layer axis of scan_layers=True.
)
FSDP_MIN_SIZE = 2**12  # Default `fsdp_min_size`.


def _granules(devices) -> tuple[str, list[list[Any]]]:
  """('slice' or 'process', the groups of devices that only the slow network (DCN) joins).

  TPU slices (distinct `slice_index` values); otherwise the processes (hosts), except on one
  TPU slice, whose chips are all linked by its ICI.
  """
  def groups(attr):
    found: dict[int, list] = {}
    for device in devices:
      found.setdefault(getattr(device, attr), []).append(device)
    return [found[key] for key in sorted(found)]
  if len({getattr(device, 'slice_index', 0) for device in devices}) > 1:
    return 'slice', groups('slice_index')
  if devices[0].platform == 'tpu':
    return 'slice', [list(devices)]
  return 'process', groups('process_index')


def _dcn_shape(shape: tuple[int, ...], num_granules: int) -> tuple[int, ...]:
  """How many granules each axis spans: as many as possible on 'data', the rest on 'fsdp'.

  `model` spans none (the caller checks that it divides the devices of a granule), so
  data x fsdp is a multiple of the granule count and this split always exists.
  """
  data = math.gcd(shape[0], num_granules)
  return data, num_granules // data, 1


def device_grid(shape: tuple[int, ...], devices: Sequence[Any]) -> np.ndarray:
  """The devices laid out on a (data, fsdp, model) grid of `shape` by their topology.

  On one slice or process, `mesh_utils.create_device_mesh` (TPU: neighbouring chips share an
  axis); across slices or processes, `create_hybrid_device_mesh`, so that the slow links
  between them carry only 'data' (then 'fsdp') and each model group stays within one.
  """
  kind, granules = _granules(devices)
  if len(granules) == 1:
    return mesh_utils.create_device_mesh(shape, devices)
  dcn = _dcn_shape(shape, len(granules))
  ici = tuple(size // parts for size, parts in zip(shape, dcn))
  return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                              process_is_granule=kind == 'process')


def make_mesh(mesh_shape: Sequence[int] = (-1, 1, 1), devices=None) -> Mesh:
  """A (data, fsdp, model) mesh over all devices of all processes; one -1 takes the rest.

  The devices are laid out by their topology (`device_grid`): a model group never spans
  TPU slices or hosts, and 'data' spans them before 'fsdp' does.
  """
  devices = jax.devices() if devices is None else list(devices)
  shape = tuple(int(n) for n in mesh_shape)
  where = f'config.mesh_shape={tuple(mesh_shape)}'
  if len(shape) != len(MESH_AXES) or any(n == 0 or n < -1 for n in shape) or shape.count(-1) > 1:
    raise errors.ConfigError(f'{where} must be 3 positive sizes for the axes {MESH_AXES}, one of '
                             'which may be -1 (all remaining devices), e.g. (-1, 1, 1).')
  known = math.prod(n for n in shape if n != -1)
  if -1 in shape:
    if len(devices) % known:
      raise errors.ConfigError(f'{where}: {len(devices)} devices do not split into groups of '
                               f'{known}; use sizes whose product divides {len(devices)}.')
    shape = tuple(len(devices) // known if n == -1 else n for n in shape)
  num_processes = len({device.process_index for device in devices})
  if math.prod(shape) != len(devices):
    raise errors.ConfigError(f'{where} needs {math.prod(shape)} devices, but there are '
                             f'{len(devices)} ({num_processes} process(es) x '
                             f'{len(devices) // num_processes} local devices); make the product '
                             'of the sizes equal the device count, or use -1.')
  kind, granules = _granules(devices)
  sizes = sorted({len(granule) for granule in granules})
  if len(sizes) > 1:
    plural = {'slice': 'slices', 'process': 'processes'}[kind]
    raise errors.ConfigError(f'{where}: the {plural} ({len(granules)}) have different device '
                             f'counts ({sizes}); give every {kind} the same number of devices.')
  model_size = shape[2]
  if len(granules) > 1 and sizes[0] % model_size:
    spans = 'hosts' if kind == 'process' else 'TPU slices'
    raise errors.ConfigError(f'{where}: the model axis ({model_size}) must divide the '
                             f'{sizes[0]} devices of each {kind}, so that a model group never '
                             f'spans {spans}.')
  return Mesh(device_grid(shape, devices), MESH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def num_batch_shards(mesh: Mesh) -> int:
  return mesh.shape['data'] * mesh.shape['fsdp']


def check_batch_size(batch_size: int, mesh: Mesh, name: str = 'batch_size'):
  shards = num_batch_shards(mesh)
  if batch_size % shards:
    raise errors.ConfigError(f'{name}={batch_size} is not divisible by the {shards} batch shards '
                             f'of the mesh (data x fsdp = {mesh.shape["data"]} x '
                             f'{mesh.shape["fsdp"]}); use a multiple of {shards}, e.g. '
                             f'{max(shards, batch_size // shards * shards)}.')


def _path_name(path) -> str:
  return '/'.join(str(getattr(key, 'key', getattr(key, 'idx', key))) for key in path)


def _leaf_spec(name: str, logical: P, shape: tuple[int, ...], mesh: Mesh,
               fsdp_min_size: int) -> P:
  """The mesh PartitionSpec of one array: its 'model' dims from `logical`, then FSDP."""
  spec = [None] * len(shape)
  if logical:
    for dim, mesh_axis in enumerate(nn.logical_to_mesh_axes(logical, LOGICAL_AXIS_RULES)):
      if mesh_axis is None or mesh.shape[mesh_axis] == 1:
        continue
      if shape[dim] % mesh.shape[mesh_axis]:
        raise errors.ConfigError(
            f'Parameter {name} of shape {shape}: dimension {dim} ({logical[dim]!r}, size '
            f'{shape[dim]}) is not divisible by the {mesh_axis!r} mesh axis '
            f'({mesh.shape[mesh_axis]}). Pick a {mesh_axis} size that divides it, or change '
            'the model (num_heads, mlp_dim).')
      spec[dim] = mesh_axis
  fsdp = mesh.shape['fsdp']
  if fsdp > 1 and math.prod(shape) >= fsdp_min_size:
    free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp == 0]
    if free:
      spec[max(free, key=lambda d: shape[d])] = 'fsdp'
  return P(*spec) if any(spec) else P()


def tree_shardings(abstract_tree: Any, mesh: Mesh, fsdp_min_size: int = FSDP_MIN_SIZE) -> Any:
  """NamedShardings for a tree of (possibly logically boxed) arrays or ShapeDtypeStructs.

  Boxed leaves (`nn.with_logical_partitioning`) give their 'model' dimensions; any leaf may
  be FSDP-split. The result has the structure of the unboxed tree.
  """
  logical = nn.get_partition_spec(abstract_tree)
  values = nn.meta.unbox(abstract_tree)

  def sharding(path, spec, value):
    return NamedSharding(mesh, _leaf_spec(_path_name(path), spec, tuple(value.shape), mesh,
                                          fsdp_min_size))

  return jax.tree_util.tree_map_with_path(sharding, logical, values,
                                          is_leaf=lambda x: isinstance(x, P))


def from_host(tree: Any, shardings: Any) -> Any:
  """Host (numpy) arrays, the same on every process, placed into `shardings` on any mesh.

  Each process puts only the shards of its own devices (`jax.make_array_from_callback`).
  """
  def place(value, sharding):
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
  return jax.tree.map(place, tree, shardings)


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """Assembles each process's numpy batch into one array split over data x fsdp."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
