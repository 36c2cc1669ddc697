"""WORKDIR/config.json: the config a run was trained with, saved beside its checkpoints."""

import json

import jax
import ml_collections
import numpy as np

from vit_jax import errors, files, progress
from vit_jax.data import normalization


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


def note_other_pixel_statistics(config: ml_collections.ConfigDict, workdir: str | None,
                                role: str = '--workdir'):
  """A note on stderr when the run in `workdir` (the --workdir, or config.pretrained) normalized
  its images otherwise than `config` does, which costs a model accuracy without an error."""
  if not workdir or config.task != 'classification':
    return
  try:
    if not files.exists(config_path(workdir)):
      return  # E.g. a published .npz as config.pretrained.
    saved = load_config(workdir).data
    mean, std = tuple(saved.pixel_mean), tuple(saved.pixel_std)
    theirs = normalization.affine(mean, std, config.data.channels)
  except errors.UserError:
    return  # The mode that reads the files (unreachable, unreadable) says what is wrong.
  ours = normalization.of_config(config.data)
  if all(np.array_equal(a, b) for a, b in zip(ours, theirs)):
    return
  advice = 'leave --config out, or set' if role == '--workdir' else 'set'
  progress.note(
      f'note: {role}={workdir} was trained with config.data.pixel_mean={mean} and pixel_std='
      f'{std}; this run normalizes its images with {tuple(config.data.pixel_mean)} and '
      f"{tuple(config.data.pixel_std)}: to take the run's, {advice} --config.data.pixel_mean and "
      'pixel_std.')


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
