"""WORKDIR/config.json: the config a run was trained with, saved beside its checkpoints."""

import json

import jax
import ml_collections

from vit_jax import errors, files, progress


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


def note_other_pixel_statistics(config: ml_collections.ConfigDict, workdir: str | None):
  """A note on stderr when the run in `workdir` normalized its images otherwise than `config`
  (a --config file beside --workdir), which costs a model its accuracy without an error."""
  if not workdir or config.task != 'classification' or not files.exists(config_path(workdir)):
    return
  try:
    saved = json.loads(files.read_text(config_path(workdir))).get('data', {})
  except (json.JSONDecodeError, AttributeError):
    return  # load_config says what is wrong with the file, if it is read.
  ours = {key: tuple(config.data[key]) for key in ('pixel_mean', 'pixel_std')}
  theirs = {key: tuple(saved.get(key, (0.5, 0.5, 0.5))) for key in ours}
  if ours != theirs:
    progress.note(
        f"note: {workdir} was trained with config.data.pixel_mean={theirs['pixel_mean']} and "
        f"pixel_std={theirs['pixel_std']}, and this run normalizes its images with "
        f"{ours['pixel_mean']} and {ours['pixel_std']}; to take the run's, leave --config out "
        'or set them.')


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
