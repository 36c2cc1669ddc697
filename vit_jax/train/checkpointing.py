"""Orbax checkpoints of the training state in WORKDIR/checkpoints, config beside them.

Saves are atomic (orbax writes to a temporary directory and renames it), so a
run killed at any moment resumes from the last completed save.
"""

import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import checkpoint as weights


def config_path(workdir: str) -> str:
  return os.path.join(workdir, 'config.json')


def save_config(workdir: str, config: ml_collections.ConfigDict):
  """Writes the run's config as WORKDIR/config.json (process 0)."""
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  with open(config_path(workdir), 'w') as f:
    f.write(config.to_json_best_effort(indent=2))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = config_path(workdir)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No config.json in {workdir}: is it the workdir of a vit_jax run?')
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


class Checkpointer:
  """Keeps the last `keep` checkpoints of a state pytree; restores the latest."""

  def __init__(self, workdir: str, keep: int = 2):
    self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    self._manager = ocp.CheckpointManager(
        self.directory, item_handlers=ocp.StandardCheckpointHandler(),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             cleanup_tmp_directories=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state) -> None:
    """Starts an asynchronous save; `wait` or the next save completes it."""
    self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, abstract_state, step: int | None = None):
    """Restores into the shapes, dtypes and shardings of `abstract_state`.

    A checkpoint written by a model of another shape is refused with the
    first mismatched parameters named.
    """
    step = self.latest_step() if step is None else step
    self._check_shapes(step, abstract_state)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def restore_params(self, step: int | None = None) -> dict:
    """The `params` of a checkpoint as host numpy arrays, whatever the model's shapes."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'No checkpoint in {self.directory}.')
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                            dict(self._manager.item_metadata(step)))
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    return jax.tree.map(np.asarray, restored['params'])

  def _check_shapes(self, step: int, abstract_state):
    stored = dict(self._manager.item_metadata(step))
    mismatched = []
    flat_expected = weights.flatten_params(abstract_state['params'])
    flat_stored = weights.flatten_params(stored['params'])
    for name in sorted(set(flat_expected) | set(flat_stored)):
      want = flat_expected.get(name)
      have = flat_stored.get(name)
      want_shape = None if want is None else tuple(want.shape)
      have_shape = None if have is None else tuple(have.shape)
      if want_shape != have_shape:
        mismatched.append(f'{name}: checkpoint {have_shape or "missing"}, '
                          f'model {want_shape or "missing"}')
    if mismatched:
      raise ValueError(
          f'The checkpoint at step {step} in {self.directory} was written by a model of '
          f'another shape ({len(mismatched)} mismatched parameters, first: '
          f'{"; ".join(mismatched[:3])}). Use a new --workdir, or the config that wrote it.')

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()

