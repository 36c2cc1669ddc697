"""Orbax checkpoints of the training state in WORKDIR/checkpoints (the config beside them:
`run_config`).

Saves are atomic (orbax writes to a temporary directory and renames it), so a
run killed at any moment resumes from the last completed save; each save is verified
(its metadata read back) once written. A checkpoint that cannot be read (truncated files
of a failing disk or an interrupted copy) is reported in one line; training sets it aside
as `unreadable-STEP` (never deleted) and resumes from the newest readable one, and the
other readers do so when asked (`fall_back`). A save that fails (a full disk) stops the
run in one line, its half-written directory removed, the earlier checkpoints intact.

Workdirs may be local, on gs:// (orbax writes there itself), or on any other filesystem
tf.io.gfile reaches (s3://, hdfs://, ram://, ...): there orbax works on a local copy,
and each completed save is uploaded (`checkpoint_mirror`).
"""

import math
import os
import re
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import errors, files, progress, weights
from vit_jax.train import checkpoint_mirror, orbax_errors, shapes

_ITEM = 'default'  # The directory of the state in each step's directory (orbax's name).
# restore_params reads this many groups of arrays one after the other: the buffers of reading
# (which orbax does concurrently within a group) stay about params / _READ_GROUPS. A group
# holds at least _MIN_READ_GROUP_BYTES: each read parses the checkpoint's whole metadata
# again, which for a small model takes far longer than its arrays.
_READ_GROUPS = 16
_MIN_READ_GROUP_BYTES = 16 * 2**20
_TMP = '.orbax-checkpoint-tmp'  # STEP + _TMP...: orbax's directory of a save being written.
_UNFINISHED = re.compile(rf'(\d+){re.escape(_TMP)}')  # Its step, from such a directory's name.
_ASIDE = 'unreadable-{step}'  # Where training moves a checkpoint it cannot read.
# How the config asks readers other than training to take an older readable checkpoint.
FALL_BACK_HINT = '--config.checkpoint_fallback=True'


class UnreadableCheckpoint(errors.BadFileError):
  """A checkpoint (or every checkpoint) of a workdir cannot be read."""


class CheckpointWriteError(errors.UserError, OSError):
  """A checkpoint could not be written (e.g. the disk is full)."""


def _megabytes(num_bytes: float) -> str:
  if num_bytes < 2**20:
    return f'{num_bytes / 2**10:,.0f} KB'
  return f'{num_bytes / 2**20:,.1f} MB'


def require_checkpoint(workdir: str):
  """Raises MissingFileError, writing nothing, unless WORKDIR holds a checkpoint."""
  with Checkpointer(workdir, read_only=True) as checkpointer:
    if checkpointer.latest_step() is None:
      raise errors.MissingFileError(f'No checkpoint in {checkpointer.directory}: train first, '
                                    'or point --workdir at a trained run.')


def restore_params(workdir: str, fall_back: bool = False, ema: bool = False) -> tuple[dict, int]:
  """The `params` of WORKDIR's latest checkpoint (host numpy arrays) and its step.

  With `fall_back`, an unreadable latest checkpoint gives way to the newest readable one;
  with `ema`, its EMA weights are read instead (ConfigError when it has none).

  Raises:
    MissingFileError: the workdir has no checkpoint.
    UnreadableCheckpoint: the latest (with `fall_back`: every) checkpoint cannot be read.
  """
  with Checkpointer(workdir, read_only=True) as checkpointer:
    if checkpointer.latest_step() is None:
      raise errors.MissingFileError(f'No checkpoint in {checkpointer.directory}: train first, '
                                    'or give the workdir of a trained run.')
    return checkpointer.restore_params(fall_back=fall_back,
                                       item='ema_params' if ema else 'params')


def _read_groups(items: dict) -> list[list[str]]:
  """The names of `items` (arrays' shapes) in consecutive groups of about 1/_READ_GROUPS
  of their bytes, and at least _MIN_READ_GROUP_BYTES (a larger array: alone)."""
  sizes = {name: math.prod(a.shape) * np.dtype(a.dtype).itemsize for name, a in items.items()}
  limit = max(sum(sizes.values()) / _READ_GROUPS, _MIN_READ_GROUP_BYTES)
  groups, group_size = [[]], 0
  for name, size in sizes.items():
    if groups[-1] and group_size + size > limit:
      groups.append([])
      group_size = 0
    groups[-1].append(name)
    group_size += size
  return groups


class Checkpointer:
  """Keeps the last `keep` checkpoints of a state pytree; restores the latest readable.

  Only training writes (`read_only=False`): it creates the directory and removes the
  temporary directories of saves that never finished. A reader (`read_only=True`: evaluate,
  predict, export, ...) changes nothing on disk, so it can read a workdir while a run is
  still training in it (and saving), and a mistyped path stays a missing one.
  """

  def __init__(self, workdir: str, keep: int = 2, *, read_only: bool = False):
    self.read_only = read_only
    self.directory = files.join(files.absolute(workdir), 'checkpoints')
    self._mirror = None
    self._unverified = None  # The step of the last save, until it is read back.
    managed = self.directory
    if files.is_remote(self.directory) and not self.directory.startswith('gs://'):
      self._mirror = checkpoint_mirror.Mirror(self.directory)
      managed = self._mirror.local
    self._managed = managed
    if not read_only and not files.is_remote(managed) and os.path.isdir(managed):
      self._say_unfinished_saves(os.listdir(managed))  # The manager below removes them.
    orbax_errors.quiet()
    self._manager = ocp.CheckpointManager(
        managed, item_handlers=ocp.StandardCheckpointHandler(),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                             cleanup_tmp_directories=not read_only))

  def _say_unfinished_saves(self, names: list[str]):
    """One line for the saves a run ended in the middle of (killed), if any."""
    steps = sorted(int(match[1]) for match in map(_UNFINISHED.match, names) if match)
    if steps:
      saves = 'save of step' if len(steps) == 1 else 'saves of steps'
      progress.log(f'Removed the unfinished {saves} {", ".join(map(str, steps))} in '
                   f'{self.directory} (the run that wrote it ended while saving).')

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  # --- Saving ---

  def save(self, step: int, state) -> None:
    """Starts an asynchronous save; `check`, `close` or the next save completes it.

    Mirrored (remote, not gs://) checkpoints are saved and uploaded before it returns.

    Raises:
      CheckpointWriteError: this save cannot fit on the disk, or the previous one failed.
    """
    assert not self.read_only, 'a read-only Checkpointer cannot save'
    self.finish()
    self._check_space(step, state)
    try:
      self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
    except Exception as error:  # pylint: disable=broad-except
      self._failed_save(step, error)
    self._unverified = step
    if self._mirror is not None:
      self.finish()
      self._mirror.sync()

  def check(self):
    """Raises `CheckpointWriteError` at once if a save running in the background failed."""
    if self._unverified is None:
      return
    try:
      self._manager.check_for_errors()
    except Exception as error:  # pylint: disable=broad-except
      self._failed_save(self._unverified, error)

  def finish(self):
    """Waits for the running save, then reads its metadata back."""
    if self._unverified is None:
      return
    step, self._unverified = self._unverified, None
    try:
      self._manager.wait_until_finished()
    except Exception as error:  # pylint: disable=broad-except
      self._failed_save(step, error)
    try:
      self._manager.reload()
      self._manager.item_metadata(step)
    except Exception as error:  # pylint: disable=broad-except
      raise CheckpointWriteError(
          f'The checkpoint just written at step {step} in {self.directory} does not read back '
          f'({orbax_errors.first_line(error)}); check the disk, then run the same command to resume from '
          'the previous checkpoint.') from None

  def _check_space(self, step: int, state):
    """Refuses a save that cannot fit, before writing anything."""
    if files.is_remote(self._managed):
      return
    needed = sum(getattr(leaf, 'nbytes', 0) for leaf in jax.tree.leaves(state))
    needed //= max(jax.process_count(), 1)  # Each process writes its shards.
    free = shutil.disk_usage(self._managed).free
    if needed > free:
      raise CheckpointWriteError(
          f'No space to save the checkpoint at step {step} in {self.directory}: it needs about '
          f'{_megabytes(needed)}, {_megabytes(free)} are free; {self._what_to_do()}')

  def _what_to_do(self) -> str:
    kept = self._manager.all_steps()
    if not kept:
      earlier = 'no earlier checkpoint exists'
    elif len(kept) == 1:
      earlier = f'the earlier checkpoint (step {kept[0]}) is intact'
    else:
      earlier = f'the earlier checkpoints (steps {", ".join(map(str, kept))}) are intact'
    return (f'{earlier}. Free some space (or set --config.keep_checkpoints lower), then run the '
            'same command to resume.')

  def _failed_save(self, step: int, error: BaseException):
    """Removes the half-written step and raises one line about it."""
    for name in (os.listdir(self._managed) if not files.is_remote(self._managed) else []):
      if name.startswith(f'{step}{_TMP}') or name == str(step):
        shutil.rmtree(os.path.join(self._managed, name), ignore_errors=True)
    self._unverified = None
    self._manager.reload()
    if self._is_disk_full(error):
      free = shutil.disk_usage(self._managed).free
      raise CheckpointWriteError(
          f'The disk ran out of space while saving the checkpoint at step {step} in '
          f'{self.directory}: a checkpoint takes about {_megabytes(self._last_size())} (the '
          f'last complete one), {_megabytes(free)} are free with the partial save removed; '
          f'{self._what_to_do()}') from None
    raise CheckpointWriteError(
        f'Saving the checkpoint at step {step} in {self.directory} failed '
        f'({orbax_errors.first_line(error)}); the earlier checkpoints are intact. Fix the cause, then run '
        'the same command to resume.') from None

  @staticmethod
  def _is_disk_full(error: BaseException) -> bool:
    text = str(error)
    return (files.is_disk_full(error) or 'No space left' in text or 'RESOURCE_EXHAUSTED' in text
            or 'File too large' in text)

  def _last_size(self) -> int:
    """Bytes of the newest complete checkpoint on disk (what the failed one needed)."""
    step = self._manager.latest_step()
    if step is None:
      return 0
    root = os.path.join(self._managed, str(step))
    return sum(os.path.getsize(os.path.join(root, name)) for name in files.walk_files(root))

  # --- Restoring ---

  def restore(self, abstract_state, step: int | None = None, *, fall_back: bool = False,
              move_aside: bool = False) -> tuple[int, dict]:
    """(step, state) of checkpoint `step` (default: the latest), in `abstract_state`'s layout.

    Restores into the shapes, dtypes and shardings of `abstract_state`. A checkpoint
    written by a model of another shape is refused with the first mismatched parameters
    named. One that cannot be read is reported in one line; with `fall_back` the next
    older one is tried, with `move_aside` (training) it is renamed `unreadable-STEP`.
    The EMA weights ('ema_params') are left out of the result when the checkpoint has none
    (EMA turned on since), and read but dropped when `abstract_state` has none.
    """
    def read(step):
      self._check_shapes(step, abstract_state)
      stored = set(dict(self._manager.item_metadata(step)))
      target = {key: value for key, value in abstract_state.items() if key in stored}
      if 'ema_params' in stored and 'ema_params' not in target:
        target['ema_params'] = abstract_state['params']  # Orbax reads all the stored keys.
      state = self._manager.restore(step, args=ocp.args.StandardRestore(target))
      return {key: value for key, value in state.items() if key in abstract_state}
    return self._first_readable(read, step, fall_back, move_aside)

  def restore_params(self, step: int | None = None, *, fall_back: bool = False,
                     abstract_params=None, item: str = 'params') -> tuple[Any, int]:
    """(params, step) of a checkpoint; only the params are read (no optimizer state).

    `item='ema_params'` reads the EMA weights instead (a run with config.ema_decay > 0).

    Without `abstract_params`: host numpy arrays, whatever the model's shapes. With it (a
    tree of ShapeDtypeStructs with shardings): arrays placed straight into its shardings,
    refused as by `restore` when the checkpoint's shapes differ. The arrays are read a group
    at a time (`_READ_GROUPS`), so that reading takes little memory beyond the params.
    """
    def read(step):
      metadata = dict(self._manager.item_metadata(step))
      if item not in metadata:
        raise errors.ConfigError(f'The checkpoint at step {step} in {self.directory} has no EMA '
                                 'weights: the run was trained with config.ema_decay=0; read '
                                 'its weights without asking for the EMA.')
      stored = weights.flatten_params(metadata[item])
      if abstract_params is None:
        items = {name: jax.ShapeDtypeStruct(m.shape, m.dtype) for name, m in stored.items()}
        restore_args = {name: ocp.RestoreArgs(restore_type=np.ndarray) for name in stored}
      else:
        self._check_shapes(step, {'params': abstract_params})
        items = weights.flatten_params(abstract_params)
        restore_args = {name: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape,
                                                   dtype=a.dtype) for name, a in items.items()}
      path = os.path.join(self._managed, str(step), _ITEM)
      params = {}
      with ocp.PyTreeCheckpointer() as reader:
        for names in _read_groups(items):
          part = reader.restore(path, args=ocp.args.PyTreeRestore(
              {item: weights.unflatten_params({name: items[name] for name in names})},
              restore_args={item: weights.unflatten_params(
                  {name: restore_args[name] for name in names})},
              partial_restore=True))
          params.update(weights.flatten_params(part[item]))
      return weights.unflatten_params(params)
    step, params = self._first_readable(read, step, fall_back, move_aside=False)
    return params, step

  def _first_readable(self, read, step: int | None, fall_back: bool, move_aside: bool):
    steps = sorted(self._manager.all_steps(), reverse=True)
    latest_asked = step is None
    if latest_asked and not steps:
      raise errors.MissingFileError(f'No checkpoint in {self.directory}.')
    step = steps[0] if latest_asked else step
    candidates = [s for s in steps if s <= step] or [step]
    problems = []
    for i, candidate in enumerate(candidates):
      try:
        return candidate, read(candidate)
      except errors.UserError:
        raise
      except Exception as error:  # pylint: disable=broad-except
        if latest_asked and candidate == steps[0] and self._rotated_away(candidate):
          # A run training in this workdir removed it (keeping its newest) as it was read:
          # the newest checkpoint now is a later one.
          return self._first_readable(read, None, fall_back, move_aside)
        problem = f'step {candidate}: {orbax_errors.why(error)}'
        if move_aside:
          problem += f' (moved to {self._move_aside(candidate)})'
        problems.append(problem)
        older = candidates[i + 1] if i + 1 < len(candidates) else None
        if not (fall_back or move_aside) or older is None:
          break
        progress.log(f'The checkpoint at {problem} in {self.directory} cannot be read; '
                     f'trying step {older}.')
    older = [s for s in steps if s < step]
    if fall_back or move_aside:
      raise UnreadableCheckpoint(
          f'No checkpoint in {self.directory} can be read ({"; ".join(problems)}). Rerun with '
          'a new --workdir to start afresh' + (', or rerun the same command to train from '
                                               'step 0' if move_aside else '') + '.')
    hint = (f'; {FALL_BACK_HINT} takes the newest readable one (step {older[0]} or older)'
            if older else '; there is no older checkpoint')
    raise UnreadableCheckpoint(f'The checkpoint at {problems[0]} in {self.directory} cannot '
                               f'be read{hint}.')

  def _rotated_away(self, step: int) -> bool:
    """Whether checkpoint `step` is gone now, and a newer one is there."""
    if files.is_remote(self._managed) or os.path.exists(os.path.join(self._managed, str(step))):
      return False
    self._manager.reload()
    return (self._manager.latest_step() or -1) > step

  def _move_aside(self, step: int) -> str:
    """Renames checkpoint `step` to `unreadable-STEP`, which the manager ignores."""
    name = _ASIDE.format(step=step)
    if files.exists(files.join(self.directory, name)):
      name += f'-{time.strftime("%Y%m%d-%H%M%S")}'
    if self._mirror is not None:
      files.move_tree(files.join(self.directory, str(step)), files.join(self.directory, name))
      files.remove_tree(files.join(self.directory, checkpoint_mirror.UPLOADED.format(step=step)))
    files.move_tree(files.join(self._managed, str(step)), files.join(self._managed, name))
    self._manager.reload()
    return files.join(self.directory, name)

  def _check_shapes(self, step: int, abstract_state):
    stored = dict(self._manager.item_metadata(step))
    shapes.check_shapes(stored['params'], abstract_state['params'],
                        f'The checkpoint at step {step} in {self.directory}')

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def close(self):
    """Completes the running save (raising if it failed) and releases the manager."""
    try:
      self.finish()
    finally:
      self._manager.close()
      if self._mirror is not None:
        self._mirror.sync()
        self._mirror.close()
