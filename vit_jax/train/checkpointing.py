"""Orbax checkpoints of the training state in WORKDIR/checkpoints, config beside them.

Saves are atomic (orbax writes to a temporary directory and renames it), so a
run killed at any moment resumes from the last completed save. Workdirs may be local,
on gs:// (orbax writes there itself), or on any other filesystem tf.io.gfile reaches
(s3://, hdfs://, ram://, ...): there orbax works on a local copy, and each completed
save is uploaded (`_Mirror`).
"""

import json
import os
import re
import shutil
import tempfile

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import errors, files, weights

_STEP = re.compile(r'\d+')
_UPLOADED = '.uploaded-{step}'  # Beside an uploaded step directory: it is complete.


def config_path(workdir: str) -> str:
  return files.join(workdir, 'config.json')


def save_config(workdir: str, config: ml_collections.ConfigDict):
  """Writes the run's config as WORKDIR/config.json (process 0)."""
  if jax.process_index() != 0:
    return
  files.makedirs(workdir)
  files.write_text_atomically(config_path(workdir), config.to_json_best_effort(indent=2))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """WORKDIR/config.json, on this version's defaults (`config.from_saved`)."""
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  path = config_path(workdir)
  if not files.exists(path):
    raise errors.MissingFileError(f'No config.json in {workdir}: is it the workdir of a vit_jax '
                                  'run?')
  try:
    saved = json.loads(files.read_text(path))
  except json.JSONDecodeError as e:
    raise errors.BadFileError(f'{path} is not valid JSON ({e}); it is not the config of a '
                              'vit_jax run, or it was cut short.') from None
  return config_lib.from_saved(saved, path)


def check_task(workdir: str, task: str, role: str = '--workdir'):
  """Raises unless `workdir` is new or holds a run of `task` (per its config.json)."""
  path = config_path(workdir)
  if not files.exists(path):
    return
  try:
    saved_task = json.loads(files.read_text(path)).get('task')
  except (json.JSONDecodeError, AttributeError):
    return  # load_config says what is wrong with the file, if it is read.
  if saved_task != task:
    raise errors.ConfigError(
        f'{role}={workdir} holds a {saved_task} run (its config.json), not a {task} one; '
        f'use another directory for this {task} config.')


def restore_params(workdir: str) -> tuple[dict, int]:
  """The `params` of WORKDIR's latest checkpoint (host numpy arrays) and its step.

  Raises:
    MissingFileError: the workdir has no checkpoint.
  """
  with Checkpointer(workdir) as checkpointer:
    step = checkpointer.latest_step()
    if step is None:
      raise errors.MissingFileError(f'No checkpoint in {checkpointer.directory}: train first, '
                                    'or give the workdir of a trained run.')
    return checkpointer.restore_params(step), step


class _Mirror:
  """A local copy of a remote checkpoint directory, for filesystems orbax cannot write.

  Holds the remote's uploaded steps; `sync` uploads the steps orbax has completed since
  and removes the remote steps orbax has deleted. One process only.
  """

  def __init__(self, remote: str):
    if jax.process_count() > 1:
      raise errors.ConfigError(
          f'Checkpoints in {remote} go through a local copy, which serves one process; with '
          f'{jax.process_count()} processes put the workdir on a shared local path or gs://.')
    self.remote = remote
    self.local = tempfile.mkdtemp(prefix='vit_jax_checkpoints_')
    for step in self._remote_steps():
      files.copy_tree(files.join(remote, str(step)), os.path.join(self.local, str(step)))

  def _remote_steps(self) -> list[int]:
    if not files.isdir(self.remote):
      return []
    names = set(files.listdir(self.remote))
    return [int(n) for n in names if _STEP.fullmatch(n) and _UPLOADED.format(step=n) in names]

  def sync(self):
    local = {int(n) for n in os.listdir(self.local) if _STEP.fullmatch(n)}
    remote = set(self._remote_steps())
    files.makedirs(self.remote)
    for step in sorted(local - remote):
      target = files.join(self.remote, str(step))
      files.remove_tree(target)  # A partial upload of a run that died.
      files.copy_tree(os.path.join(self.local, str(step)), target)
      files.write_bytes_atomically(files.join(self.remote, _UPLOADED.format(step=step)), b'')
    for step in sorted(remote - local):
      files.remove_tree(files.join(self.remote, _UPLOADED.format(step=step)))
      files.remove_tree(files.join(self.remote, str(step)))

  def close(self):
    shutil.rmtree(self.local, ignore_errors=True)


class Checkpointer:
  """Keeps the last `keep` checkpoints of a state pytree; restores the latest."""

  def __init__(self, workdir: str, keep: int = 2):
    self.directory = files.join(files.absolute(workdir), 'checkpoints')
    self._mirror = None
    managed = self.directory
    if files.is_remote(self.directory) and not self.directory.startswith('gs://'):
      self._mirror = _Mirror(self.directory)
      managed = self._mirror.local
    self._manager = ocp.CheckpointManager(
        managed, item_handlers=ocp.StandardCheckpointHandler(),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             cleanup_tmp_directories=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state) -> None:
    """Starts an asynchronous save; `close` or the next save completes it.

    Mirrored (remote, not gs://) checkpoints are saved and uploaded before it returns.
    """
    self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
    if self._mirror is not None:
      self._manager.wait_until_finished()
      self._mirror.sync()

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
      raise errors.MissingFileError(f'No checkpoint in {self.directory}.')
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
      raise errors.ConfigError(
          f'The checkpoint at step {step} in {self.directory} was written by a model of '
          f'another shape ({len(mismatched)} mismatched parameters, first: '
          f'{"; ".join(mismatched[:3])}). Use a new --workdir, or the config that wrote it.')

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()
    if self._mirror is not None:
      self._mirror.sync()
      self._mirror.close()

