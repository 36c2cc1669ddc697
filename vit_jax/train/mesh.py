"""Device mesh and shardings: the batch on the 'data' axis, params replicated or FSDP."""

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

PARAM_SHARDINGS = ('replicated', 'fsdp')
DATA_AXIS = 'data'
# Leaves smaller than this stay replicated under FSDP: sharding them saves nothing.
FSDP_MIN_SIZE = 2**12


def make_mesh(devices=None) -> Mesh:
  """A 1-D mesh over all devices (of all processes) on the 'data' axis."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _fsdp_spec(shape, axis_size: int) -> P:
  """Shard the largest dimension divisible by the axis size; else replicate."""
  if math.prod(shape) < FSDP_MIN_SIZE:
    return P()
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if shape[dim] % axis_size == 0:
      spec = [None] * len(shape)
      spec[dim] = DATA_AXIS
      return P(*spec)
  return P()


def tree_shardings(tree, mesh: Mesh, mode: str):
  """Shardings for a tree of arrays (or ShapeDtypeStructs): 'replicated' or 'fsdp'."""
  if mode not in PARAM_SHARDINGS:
    raise ValueError(f'Unknown param_sharding {mode!r}; choose one of {PARAM_SHARDINGS}.')
  axis_size = mesh.shape[DATA_AXIS]
  if mode == 'replicated' or axis_size == 1:
    return jax.tree.map(lambda _: replicated(mesh), tree)
  return jax.tree.map(lambda x: NamedSharding(mesh, _fsdp_spec(x.shape, axis_size)), tree)


def check_batch_size(batch_size: int, mesh: Mesh, name: str = 'batch_size'):
  devices = mesh.size
  if batch_size % devices:
    raise ValueError(f'{name}={batch_size} is not divisible by the number of devices '
                     f'({devices}); use a multiple of {devices}, e.g. '
                     f'{max(devices, batch_size // devices * devices)}.')


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """Assembles each process's numpy batch into one array sharded on 'data'."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
