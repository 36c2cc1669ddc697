"""Weight files: `.npz` (published layout), `.safetensors` (timm) and orbax workdirs.

Files are read from local paths, http(s) URLs and tf.io.gfile paths (gs://...)
through `vit_jax.files`, and written all or nothing (temporary file + rename).
"""

import io
import os
import shutil
import zipfile
from typing import Any, Mapping

import numpy as np
import safetensors.numpy

from vit_jax import errors, files
from vit_jax.weights.layout import as_float32, flatten_params, unflatten_params


def load_npz(path: str | os.PathLike) -> dict[str, Any]:
  """Nested float32 params from an `.npz` whose keys are '/'-joined parameter paths.

  Reads local paths, http(s) URLs and tf.io.gfile paths (gs://...). The
  arrays are returned as stored (no renaming); see `layout.canonicalize`.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file is not a readable `.npz` (truncated or corrupt).
  """
  path = os.fspath(path)
  if not files.is_remote(path) and not os.path.exists(path):
    raise errors.MissingFileError(f'Checkpoint {path} does not exist.')
  # A remote file that cannot be reached says so itself (files.read_bytes).
  source = io.BytesIO(files.read_bytes(path)) if files.is_remote(path) else path
  try:
    archive = np.load(source, allow_pickle=False)
    if not isinstance(archive, np.lib.npyio.NpzFile):
      raise ValueError('it holds a single array (.npy), not named arrays')
    with archive:
      flat = {name: as_float32(name, archive[name]) for name in archive.files}
  except errors.MissingFileError:
    raise
  except (IsADirectoryError, PermissionError):
    raise
  except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
    raise errors.BadFileError(f'Cannot read checkpoint {path}: {_npz_failure(e)}. The file is '
                              'truncated or corrupt, or not an .npz; download or write it '
                              'again.') from e
  if not flat:
    raise errors.BadFileError(f'Checkpoint {path} holds no arrays.')
  return unflatten_params(flat)


def _npz_failure(error: Exception) -> str:
  """Why np.load failed, for the user. Bytes that start as neither a zip archive nor an .npy
  file, numpy takes for a pickle, and says to load them unpickled if the file is trusted:
  advice that does not apply to a checkpoint."""
  if isinstance(error, ValueError) and 'allow_pickle' in str(error):
    return "its first bytes are neither a zip archive's (an .npz is one) nor an .npy file's"
  return f'{type(error).__name__}: {str(error).rstrip(".")}'


def save_npz(path: str | os.PathLike, params: Mapping[str, Any], *,
             overwrite: bool = False) -> None:
  """Writes `params` (nested or flat) as an `.npz` keyed by '/'-joined paths, in float32.

  The file appears complete or not at all (temporary file + rename). Names
  are written as given: use `layout.canonicalize` first for the published numbering.

  Raises:
    FileExistsError: `path` exists and `overwrite` is False.
  """
  flat = {name: np.ascontiguousarray(as_float32(name, value))
          for name, value in flatten_params(params).items()}

  def write(tmp_path):
    with open(tmp_path, 'wb') as f:
      np.savez(f, **flat)

  files.write_atomically(path, write, overwrite=overwrite)


def save_safetensors(path: str | os.PathLike, state_dict: Mapping[str, Any], *,
                     overwrite: bool = False) -> None:
  """Writes {name: array} as `.safetensors` (all or nothing: temp file + rename).

  Raises:
    FileExistsError: `path` exists and `overwrite` is False.
  """
  tensors = {name: np.ascontiguousarray(value) for name, value in state_dict.items()}
  files.write_atomically(
      path, lambda tmp: safetensors.numpy.save_file(tensors, tmp, metadata={'format': 'pt'}),
      overwrite=overwrite)


def load_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """{name: array} from a `.safetensors` file (local, http(s) or tf.io.gfile path).

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file is truncated or corrupt.
  """
  path = os.fspath(path)
  if not files.is_remote(path) and not os.path.isfile(path):
    raise errors.MissingFileError(f'Checkpoint {path} does not exist.')
  remote_bytes = files.read_bytes(path) if files.is_remote(path) else None
  try:
    if remote_bytes is not None:
      return safetensors.numpy.load(remote_bytes)
    return safetensors.numpy.load_file(path)
  except Exception as e:  # safetensors raises its own SafetensorError.
    raise errors.BadFileError(f'Cannot read checkpoint {path}: {type(e).__name__}: '
                              f'{str(e).rstrip(".")}. The file is truncated or corrupt, or not '
                              '.safetensors; download or write it again.') from e


def read_orbax(path: str, fall_back: bool = False, ema: bool = False) -> dict:
  """The params of the latest orbax checkpoint in the workdir `path` (nested, numpy).

  With `fall_back`, an unreadable latest checkpoint gives way to the newest readable one;
  with `ema`, its EMA weights are read (a run trained with config.ema_decay > 0).
  """
  from vit_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise errors.MissingFileError(f'{path} does not exist.')
  if not os.path.isdir(os.path.join(path, 'checkpoints')):
    raise errors.ConfigError(f'{path} is not a vit_jax workdir: it has no checkpoints/ directory.')
  return checkpointing.restore_params(path, fall_back, ema)[0]


def write_orbax(path: str, params: Mapping[str, Any], *, overwrite: bool = False) -> None:
  """Writes `params` as a workdir holding one orbax checkpoint, PATH/checkpoints/0.

  The result loads with `--config.pretrained=PATH`. It is built beside `path`
  and renamed into place, so a failure leaves `path` as it was; `overwrite` replaces only
  such a directory (an earlier conversion), never a training workdir.
  """
  from vit_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  if os.path.lexists(path) and not overwrite:
    raise FileExistsError(f'{path} already exists; pass --overwrite to replace it.')
  if os.path.lexists(path):
    files.check_replaceable(path, 'conversion (a directory holding only checkpoints/)',
                            lambda p: os.path.isdir(p) and os.listdir(p) == ['checkpoints'])
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise errors.MissingFileError(f'Cannot write {path}: directory {parent} does not exist.')
  staging = files.staging_dir(path)
  try:
    writer = checkpointing.Checkpointer(staging, keep=1)
    writer.save(0, {'params': unflatten_params(dict(params))})
    writer.close()
    files.replace_with_dir(staging, path)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
