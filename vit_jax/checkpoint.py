"""ViT checkpoints in Google's published `.npz` layout: read, write, fit to a model.

The layout is one float32 array per parameter, keyed by
its path joined with '/': `cls`, `embedding/kernel`,
`Transformer/posembed_input/pos_embedding`,
`Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1,
LayerNorm_2, MlpBlock_3}/...`, `Transformer/encoder_norm`, [`pre_logits`],
`head`; hybrids add `conv_root`, `gn_root`, `block{s}/unit{u}/...`; DeiT adds
`dist` and `head_dist`. Those are also the names of our Flax parameters.

`load_pretrained` fits such a checkpoint to a freshly initialised model: it
accepts both module numberings, stacked (scanned) or per-layer blocks on either
side, (1, 1, 1, C) GroupNorm arrays, a missing or extra `pre_logits`, another
class count and another image resolution. Everything runs in numpy on the host.
"""

import io
import logging
import math
import os
import re
import zipfile
from typing import Any, Mapping, NamedTuple

from flax.core import FrozenDict, freeze
import numpy as np

from vit_jax import errors, files
from vit_jax.models.vit import PREFIX_TOKENS

FlatParams = dict[str, Any]  # '/'-joined parameter path -> array.

POSEMB = 'Transformer/posembed_input/pos_embedding'
EXTRA_TOKENS = PREFIX_TOKENS['token_distill']  # The tokens before the patch grid, in order.
HEAD_PREFIXES = ('head/', 'head_dist/')
PRE_LOGITS_PREFIX = 'pre_logits/'
STACKED_BLOCK = 'encoderblock'  # Segment name of the scanned block, layer axis first.

# Current Flax numbers sub-modules per type; the published files number them
# per block. Only the per-type names that differ need renaming.
_PER_TYPE_TO_PUBLISHED = {
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'LayerNorm_1': 'LayerNorm_2',
    'MlpBlock_0': 'MlpBlock_3',
}
_BLOCK_SEGMENT = re.compile(r'encoderblock_\d+')
_GROUPNORM_SEGMENT = re.compile(r'gn(_root|_proj|\d+)')
_MAX_LISTED = 10  # Mismatches shown in an error message.

_log = logging.getLogger(__name__)


class ShapeOnly(NamedTuple):
  """A parameter known only by shape (e.g. from `jax.eval_shape`)."""
  shape: tuple[int, ...]
  dtype: Any


# ----------------------------------------------------------------------------
# Trees and names.


def flatten_params(tree: Mapping[str, Any]) -> FlatParams:
  """Nested mapping -> {'a/b/c': leaf}, in the mapping's order."""
  flat = {}

  def visit(node, prefix):
    for key, value in node.items():
      name = f'{prefix}{key}'
      if isinstance(value, Mapping):
        visit(value, f'{name}/')
      else:
        flat[name] = value

  visit(tree, '')
  return flat


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{'a/b/c': leaf} -> nested dicts; a name that is both leaf and folder is an error."""
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    *folders, leaf = name.split('/')
    node = tree
    for i, folder in enumerate(folders):
      node = node.setdefault(folder, {})
      if not isinstance(node, dict):
        raise ValueError(f'Parameter {"/".join(folders[:i + 1])!r} is both an array and '
                         f'the folder of {name!r}; the names are inconsistent.')
    if leaf in node:
      raise ValueError(f'Parameter {name!r} is both an array and a folder of other '
                       'parameters; the names are inconsistent.')
    node[leaf] = value
  return tree


def _to_host(value: Any) -> Any:
  """numpy array for arrays (device arrays are copied to the host); ShapeOnly otherwise."""
  if isinstance(value, np.ndarray):
    return value
  if hasattr(value, '__array__'):
    return np.asarray(value)
  if hasattr(value, 'shape') and hasattr(value, 'dtype'):  # jax.ShapeDtypeStruct.
    return ShapeOnly(tuple(value.shape), value.dtype)
  return np.asarray(value)


def _as_float32(name: str, value: Any) -> np.ndarray:
  value = np.asarray(value)
  if not (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)
          or value.dtype.name == 'bfloat16'):
    raise ValueError(f'Parameter {name!r} has dtype {value.dtype}, not a number type; '
                     'it cannot be a model parameter.')
  return value.astype(np.float32, copy=False)


def _is_stacked_name(name: str) -> bool:
  return STACKED_BLOCK in name.split('/')


def unstack_blocks(flat: FlatParams) -> FlatParams:
  """`.../encoderblock/x` arrays with a leading layer axis -> `.../encoderblock_{i}/x`."""
  stacked = {name: value for name, value in flat.items() if _is_stacked_name(name)}
  if not stacked:
    return dict(flat)
  if any(_BLOCK_SEGMENT.fullmatch(s) for name in flat for s in name.split('/')):
    raise ValueError('The parameters hold both stacked (`encoderblock/...`) and per-layer '
                     '(`encoderblock_{i}/...`) blocks; keep one of the two.')
  num_layers = {value.shape[0] for value in stacked.values()}
  if len(num_layers) != 1:
    raise ValueError(f'Stacked `encoderblock` arrays disagree on the number of layers '
                     f'(leading axis sizes {sorted(num_layers)}).')
  (num_layers,) = num_layers
  out = {}
  for name, value in flat.items():
    if name not in stacked:
      out[name] = value
      continue
    segments = name.split('/')
    at = segments.index(STACKED_BLOCK)
    for i in range(num_layers):
      segments[at] = f'{STACKED_BLOCK}_{i}'
      layer = (ShapeOnly(value.shape[1:], value.dtype) if isinstance(value, ShapeOnly)
               else value[i])
      out['/'.join(segments)] = layer
  return out


def stack_blocks(flat: FlatParams) -> FlatParams:
  """Inverse of `unstack_blocks`: `encoderblock_{i}/x` -> `encoderblock/x` (layer axis 0)."""
  layers: dict[str, dict[int, np.ndarray]] = {}
  out: FlatParams = {}
  for name, value in flat.items():
    segments = name.split('/')
    at = next((j for j, s in enumerate(segments) if _BLOCK_SEGMENT.fullmatch(s)), None)
    if at is None:
      out[name] = value
      continue
    index = int(segments[at].split('_')[-1])
    segments[at] = STACKED_BLOCK
    stacked_name = '/'.join(segments)
    if stacked_name not in layers:
      layers[stacked_name] = {}
      out[stacked_name] = None  # Keeps the position of the first layer's entry.
    layers[stacked_name][index] = value
  for name, by_index in layers.items():
    if sorted(by_index) != list(range(len(by_index))):
      raise ValueError(f'Cannot stack {name!r}: layers {sorted(by_index)} are not 0..L-1.')
    out[name] = np.stack([by_index[i] for i in range(len(by_index))])
  return out


def _published_name(name: str) -> str:
  """Renames per-type numbered sub-modules of an encoder block to the published names."""
  segments = name.split('/')
  for j in range(len(segments) - 1):
    if _BLOCK_SEGMENT.fullmatch(segments[j]):
      segments[j + 1] = _PER_TYPE_TO_PUBLISHED.get(segments[j + 1], segments[j + 1])
  return '/'.join(segments)


def _is_groupnorm_param(name: str) -> bool:
  segments = name.split('/')
  return (len(segments) >= 2 and segments[-1] in ('scale', 'bias')
          and bool(_GROUPNORM_SEGMENT.fullmatch(segments[-2])))


def canonicalize(params: Mapping[str, Any]) -> FlatParams:
  """Any accepted checkpoint layout -> flat float32 arrays under the published names.

  Unstacks `encoderblock` arrays into `encoderblock_{i}`, renames per-type
  numbered block modules (`MultiHeadDotProductAttention_0`, `LayerNorm_1`,
  `MlpBlock_0`) to the published ones, and reshapes (1, 1, 1, C) GroupNorm
  scale/bias to (C,). `params` may be nested or already flat ('/'-joined keys),
  and wrapped as {'params': ...}.
  """
  if set(params) == {'params'} and isinstance(params['params'], Mapping):
    params = params['params']
  flat = {name: _as_float32(name, value) for name, value in flatten_params(params).items()}
  out: FlatParams = {}
  renamed_from: dict[str, str] = {}
  for name, value in unstack_blocks(flat).items():
    published = _published_name(name)
    if _is_groupnorm_param(published) and value.ndim == 4 and value.shape[:3] == (1, 1, 1):
      value = value.reshape(-1)
    if published in out:
      raise ValueError(f'Both {renamed_from[published]!r} and {name!r} map to {published!r}: '
                       'the checkpoint mixes the two module numberings.')
    out[published] = value
    renamed_from[published] = name
  return out


# ----------------------------------------------------------------------------
# Files.


def load_npz(path: str | os.PathLike) -> dict[str, Any]:
  """Nested float32 params from an `.npz` whose keys are '/'-joined parameter paths.

  Reads local paths, http(s) URLs and tf.io.gfile paths (gs://...). The
  arrays are returned as stored (no renaming); see `canonicalize`.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file is not a readable `.npz` (truncated or corrupt).
  """
  path = os.fspath(path)
  if not files.is_remote(path) and not os.path.exists(path):
    raise errors.MissingFileError(f'Checkpoint {path} does not exist.')
  try:
    source = io.BytesIO(files.read_bytes(path)) if files.is_remote(path) else path
    archive = np.load(source, allow_pickle=False)
    if not isinstance(archive, np.lib.npyio.NpzFile):
      raise ValueError('it holds a single array (.npy), not named arrays')
    with archive:
      flat = {name: _as_float32(name, archive[name]) for name in archive.files}
  except errors.MissingFileError:
    raise
  except (IsADirectoryError, PermissionError):
    raise
  except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
    raise errors.BadFileError(f'Cannot read checkpoint {path}: {type(e).__name__}: {e}. The '
                              'file is truncated or corrupt, or not an .npz; download or '
                              'write it again.') from e
  if not flat:
    raise errors.BadFileError(f'Checkpoint {path} holds no arrays.')
  return unflatten_params(flat)


def save_npz(path: str | os.PathLike, params: Mapping[str, Any], *,
             overwrite: bool = False) -> None:
  """Writes `params` (nested or flat) as an `.npz` keyed by '/'-joined paths, in float32.

  The file appears complete or not at all (temporary file + rename). Names
  are written as given: use `canonicalize` first for the published numbering.

  Raises:
    FileExistsError: `path` exists and `overwrite` is False.
  """
  flat = {name: np.ascontiguousarray(_as_float32(name, value))
          for name, value in flatten_params(params).items()}

  def write(tmp_path):
    with open(tmp_path, 'wb') as f:
      np.savez(f, **flat)

  files.write_atomically(path, write, overwrite=overwrite)


# ----------------------------------------------------------------------------
# Fitting a checkpoint to a model.


def _square_grid(num_tokens: int, what: str) -> tuple[int, int]:
  side = math.isqrt(num_tokens)
  if side * side != num_tokens:
    raise ValueError(f'The {what} position embedding has {num_tokens} grid tokens, not a '
                     'square grid; pass grid_size=(height, width) of the target grid.')
  return side, side


def _linear_interpolation_matrix(in_size: int, out_size: int) -> np.ndarray:
  """(out, in) weights of 1-D linear interpolation with half-pixel centres."""
  centres = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
  centres = np.clip(centres, 0, in_size - 1)
  low = np.floor(centres).astype(int)
  high = np.minimum(low + 1, in_size - 1)
  frac = centres - low
  weights = np.zeros((out_size, in_size))
  rows = np.arange(out_size)
  np.add.at(weights, (rows, low), 1 - frac)
  np.add.at(weights, (rows, high), frac)
  return weights


def resize_posemb(posemb: np.ndarray, num_extra_tokens: int,
                  grid_size: tuple[int, int], source_grid: tuple[int, int] | None = None
                  ) -> np.ndarray:
  """Resizes a (1, extra + h*w, D) position embedding to the grid `grid_size`.

  The first `num_extra_tokens` rows (class/distillation tokens) are kept as
  they are; the patch grid (square unless `source_grid` is given) is resized
  bilinearly with half-pixel centres and no antialiasing (as
  `jax.image.resize(..., 'bilinear', antialias=False)` and torch's
  `interpolate(mode='bilinear', align_corners=False)`).
  """
  posemb = np.asarray(posemb, np.float32)
  extra, grid = posemb[:, :num_extra_tokens], posemb[0, num_extra_tokens:]
  src_h, src_w = source_grid or _square_grid(grid.shape[0], 'checkpoint')
  if src_h * src_w != grid.shape[0]:
    raise ValueError(f'source_grid {source_grid} does not hold the {grid.shape[0]} grid '
                     'tokens of the position embedding.')
  grid = grid.reshape(src_h, src_w, -1).astype(np.float64)
  rows = _linear_interpolation_matrix(src_h, grid_size[0])
  cols = _linear_interpolation_matrix(src_w, grid_size[1])
  resized = np.einsum('yh,hwd,xw->yxd', rows, grid, cols)
  resized = resized.reshape(1, grid_size[0] * grid_size[1], -1).astype(np.float32)
  return np.concatenate([extra, resized], axis=1)


def _shape(value: Any) -> tuple[int, ...]:
  return tuple(value.shape)


def _init_value(name: str, value: Any, why: str) -> np.ndarray:
  if isinstance(value, ShapeOnly):
    raise ValueError(f'{name} must come from the model ({why}), but init_params holds '
                     'only its shape; pass initialised params (model.init(...)).')
  return np.asarray(value, np.float32)


def format_mismatches(problems: list[tuple[str, Any, Any]]) -> str:
  """'name: file shape vs model shape; ...' for the first few (name, shape, shape), one line."""
  def show(shape):
    return 'missing' if shape is None else str(tuple(shape))
  items = [f'{name}: {show(file_shape)} vs {show(model_shape)}'
           for name, file_shape, model_shape in problems[:_MAX_LISTED]]
  if len(problems) > _MAX_LISTED:
    items.append(f'and {len(problems) - _MAX_LISTED} more')
  return '; '.join(items)


def load_pretrained(checkpoint: str | os.PathLike | Mapping[str, Any],
                    init_params: Mapping[str, Any], *, reinit_head: bool = False,
                    grid_size: tuple[int, int] | None = None,
                    source_name: str | None = None) -> Any:
  """Fits a published-layout checkpoint to a model; returns params like `init_params`.

  Args:
    checkpoint: path of an `.npz` (see `load_npz`), or params (nested or
      '/'-flat) in any layout `canonicalize` accepts.
    init_params: freshly initialised params of the target model (any image
      resolution and class count; per-layer or scanned blocks; optionally
      wrapped as {'params': ...}). Leaves may be `jax.ShapeDtypeStruct`s when
      nothing has to be taken from the model.
    reinit_head: take `head` (and `head_dist`) from `init_params` even when
      the class count matches.
    grid_size: (height, width) patch grid of the target when its token count
      is not a square.
    source_name: what errors call the checkpoint (default: its path, or 'The checkpoint').

  Returns:
    The same structure as `init_params` with float32 numpy leaves: the
    checkpoint's arrays, except
    - `head`/`head_dist` from `init_params` when the class count differs, when
      `reinit_head`, when the file has no head, or when only one side has a
      `pre_logits` layer (the head was trained on top of it);
    - `pre_logits` (and the heads) dropped if the model has none, and taken
      from `init_params` if the file has none;
    - the position embedding's patch grid resized to the model's grid (class
      and distillation token rows kept).

  Raises:
    ValueError: any other missing, unexpected or differently shaped parameter;
      the message lists them (file vs model).
  """
  wrapped = set(init_params) == {'params'} and isinstance(init_params['params'], Mapping)
  target_tree = init_params['params'] if wrapped else init_params
  if isinstance(checkpoint, (str, os.PathLike)):
    source_desc, checkpoint = os.fspath(checkpoint), load_npz(checkpoint)
  else:
    source_desc = 'The checkpoint'
  source_desc = source_name or source_desc
  source = canonicalize(checkpoint)
  target = {name: _to_host(value) for name, value in flatten_params(target_tree).items()}
  scanned = any(_is_stacked_name(name) for name in target)
  target = unstack_blocks(target)

  file_has_pre_logits = any(n.startswith(PRE_LOGITS_PREFIX) for n in source)
  model_has_pre_logits = any(n.startswith(PRE_LOGITS_PREFIX) for n in target)
  head_from_model = reinit_head or file_has_pre_logits != model_has_pre_logits
  head_reason = ('reinit_head=True' if reinit_head else
                 'pre_logits only in the ' + ('file' if file_has_pre_logits else 'model'))

  result: FlatParams = {}
  from_model: dict[str, str] = {}  # Name -> why it is taken from init_params.
  problems: list[tuple[str, Any, Any]] = []
  for name, init in target.items():
    is_head = name.startswith(HEAD_PREFIXES)
    init_shape = _shape(init)
    if name not in source:
      if is_head or name.startswith(PRE_LOGITS_PREFIX):
        from_model[name] = 'not in the checkpoint'
      else:
        problems.append((name, None, init_shape))
      continue
    value = source[name]
    if is_head and head_from_model:
      from_model[name] = head_reason
    elif value.shape == init_shape:
      result[name] = value
    elif is_head and value.shape[:-1] == init_shape[:-1]:
      from_model[name] = (f'the file has {value.shape[-1]} classes, the model '
                          f'{init_shape[-1]}')
    elif name == POSEMB and value.ndim == 3 and value.shape[2] == init_shape[2]:
      num_extra = sum(token in target for token in EXTRA_TOKENS)
      if num_extra != sum(token in source for token in EXTRA_TOKENS):
        problems.append((name, value.shape, init_shape))
        continue
      num_grid = init_shape[1] - num_extra
      grid = grid_size or _square_grid(num_grid, 'model')
      if grid[0] * grid[1] != num_grid:
        raise ValueError(f'grid_size={grid_size} has {grid[0] * grid[1]} cells, but the '
                         f'model has {num_grid} grid tokens ({init_shape[1]} tokens minus '
                         f'{num_extra} class token(s)).')
      result[name] = resize_posemb(value, num_extra, grid)
      _log.info('%s: resized %s -> %s (grid %dx%d).', name, value.shape, init_shape, *grid)
    else:
      problems.append((name, value.shape, init_shape))
  # The model may lack the file's pre_logits and head(s), e.g. a feature extractor.
  droppable = (PRE_LOGITS_PREFIX, *HEAD_PREFIXES)
  dropped = [name for name in source if name not in target and name.startswith(droppable)]
  problems += [(name, value.shape, None) for name, value in source.items()
               if name not in target and not name.startswith(droppable)]
  if problems:
    # Top-level names (embedding, tokens, head) tell most; block names come after.
    problems.sort(key=lambda problem: 'encoderblock_' in problem[0])
    raise errors.ConfigError(
        f'{source_desc} does not fit the model: {len(problems)} mismatched parameter(s) '
        f'(file vs model: {format_mismatches(problems)}). Check that the checkpoint '
        'is of the same architecture (width, depth, patch size, hybrid stem, '
        'classifier tokens) as the model named in the config.')
  for name, why in from_model.items():
    result[name] = _init_value(name, target[name], why)
    _log.info('%s: taken from the model (%s).', name, why)
  if dropped:
    _log.info('Dropped %s: not in the model.', ', '.join(dropped))
  result = {name: result[name] for name in target}  # The model's order.

  if scanned:
    result = stack_blocks(result)
  tree = unflatten_params(result)
  tree = {'params': tree} if wrapped else tree
  return freeze(tree) if isinstance(init_params, FrozenDict) else tree
