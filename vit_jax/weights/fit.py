"""Fitting a published-layout checkpoint to a freshly initialised model.

`load_pretrained` accepts both module numberings, stacked (scanned) or
per-layer blocks on either side, (1, 1, 1, C) GroupNorm arrays, a missing or
extra `pre_logits`, another class count and another image resolution (the
position embedding's patch grid is resized). Everything runs in numpy on the host.
"""

import dataclasses
import math
import os
from typing import Any, Callable, Mapping

from flax.core import FrozenDict, freeze
import jax
import numpy as np

from vit_jax import errors, progress
from vit_jax.models.layers import stack_layers
from vit_jax.weights.layout import (HEAD_PREFIXES, POSEMB, PRE_LOGITS_PREFIX, STACKED_BLOCK,
                                    FlatParams, canonicalize, flatten_params, is_stacked_name,
                                    num_prefix_tokens, posemb_side, unflatten_params,
                                    unstack_blocks)
from vit_jax.weights.storage import load_npz

_MAX_LISTED = 10  # Mismatches shown in an error message.


@dataclasses.dataclass(frozen=True)
class ShapeOnly:
  """A parameter known only by shape (e.g. from `jax.eval_shape`).

  Indexing drops the leading axis, as it does for an array, so that stacked
  blocks unstack alike.
  """
  shape: tuple[int, ...]
  dtype: Any

  def __getitem__(self, index: int) -> 'ShapeOnly':
    return ShapeOnly(self.shape[1:], self.dtype)


def _to_host(value: Any) -> Any:
  """numpy array for arrays (device arrays are copied to the host); ShapeOnly otherwise."""
  if isinstance(value, np.ndarray):
    return value
  if hasattr(value, '__array__'):
    return np.asarray(value)
  if hasattr(value, 'shape') and hasattr(value, 'dtype'):  # jax.ShapeDtypeStruct.
    return ShapeOnly(tuple(value.shape), value.dtype)
  return np.asarray(value)


def _stack_on_host(flat: FlatParams) -> FlatParams:
  """`encoderblock_{i}/x` -> `encoderblock/x` (layer axis first) as numpy arrays."""
  try:
    host = jax.local_devices(backend='cpu')[0]
  except RuntimeError:  # JAX_PLATFORMS leaves out the CPU.
    host = None
  with jax.default_device(host):
    stacked = stack_layers(unflatten_params(flat), STACKED_BLOCK)
  return {name: np.asarray(value) for name, value in flatten_params(stacked).items()}


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


def _top_names(flat: FlatParams) -> str:
  names = sorted({name.split('/')[0] for name in flat})
  return ', '.join(names[:_MAX_LISTED]) + ', ...' * (len(names) > _MAX_LISTED)


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
                    source_name: str | None = None,
                    init_values: Callable[[list[str]], Mapping[str, Any]] | None = None) -> Any:
  """Fits a published-layout checkpoint to a model; returns params like `init_params`.

  Args:
    checkpoint: path of an `.npz` (see `storage.load_npz`), or params (nested
      or '/'-flat) in any layout `layout.canonicalize` accepts.
    init_params: freshly initialised params of the target model (any image
      resolution and class count; per-layer or scanned blocks; optionally
      wrapped as {'params': ...}). Leaves may be `jax.ShapeDtypeStruct`s when
      nothing has to be taken from the model.
    reinit_head: take `head` (and `head_dist`) from `init_params` even when
      the class count matches.
    grid_size: (height, width) patch grid of the target when its token count
      is not a square.
    source_name: what errors call the checkpoint (default: its path, or 'The checkpoint').
    init_values: where `init_params` holds only shapes, gives the model's fresh values of
      the '/'-named parameters that are taken from it (the head when re-initialised), e.g.
      from the model's init on one device; called once, for those only.

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
  scanned = any(is_stacked_name(name) for name in target)
  target = unstack_blocks(target)

  file_has_pre_logits = any(n.startswith(PRE_LOGITS_PREFIX) for n in source)
  model_has_pre_logits = any(n.startswith(PRE_LOGITS_PREFIX) for n in target)
  head_from_model = reinit_head or file_has_pre_logits != model_has_pre_logits
  head_reason = ('reinit_head=True' if reinit_head else
                 'pre_logits only in the ' + ('file' if file_has_pre_logits else 'model'))

  result: FlatParams = {}
  changes: list[str] = []  # What fitting changed, said in one line.
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
      num_extra = num_prefix_tokens(target)
      if num_extra != num_prefix_tokens(source):
        problems.append((name, value.shape, init_shape))
        continue
      num_grid = init_shape[1] - num_extra
      grid = grid_size or _square_grid(num_grid, 'model')
      if grid[0] * grid[1] != num_grid:
        raise ValueError(f'grid_size={grid_size} has {grid[0] * grid[1]} cells, but the '
                         f'model has {num_grid} grid tokens ({init_shape[1]} tokens minus '
                         f'{num_extra} class token(s)).')
      result[name] = resize_posemb(value, num_extra, grid)
      side = posemb_side(source)
      changes.append(f'position embedding resized from {f"a {side}x{side}" if side else "its"} '
                     f'grid to {grid[0]}x{grid[1]}')
    else:
      problems.append((name, value.shape, init_shape))
  # The model may lack the file's pre_logits and head(s), e.g. a feature extractor.
  droppable = (PRE_LOGITS_PREFIX, *HEAD_PREFIXES)
  dropped = [name for name in source if name not in target and name.startswith(droppable)]
  problems += [(name, value.shape, None) for name, value in source.items()
               if name not in target and not name.startswith(droppable)]
  if problems and not set(source) & set(target):  # Another kind of model altogether.
    kind = ("a seq2seq Transformer's" if any(n.startswith('decoder/') for n in source) else
            "a ViT's" if 'embedding/kernel' in source else "another model's")
    raise errors.ConfigError(
        f'{source_desc} shares no parameter with the model: it holds {kind} weights (top-level '
        f'names {_top_names(source)}), the model has {_top_names(target)}. Give a checkpoint '
        'of the model named in the config.')
  if problems:
    # Top-level names (embedding, tokens, head) tell most; block names come after.
    problems.sort(key=lambda problem: 'encoderblock_' in problem[0])
    raise errors.ConfigError(
        f'{source_desc} does not fit the model: {len(problems)} mismatched parameter(s) '
        f'(file vs model: {format_mismatches(problems)}). Check that the checkpoint '
        'is of the same architecture (width, depth, patch size, hybrid stem, '
        'classifier tokens) as the model named in the config.')
  needed = [name for name in from_model if isinstance(target[name], ShapeOnly)]
  if needed and init_values is not None:
    fresh = init_values(needed)
    target.update({name: _to_host(fresh[name]) for name in needed})
  new_by_reason: dict[str, set[str]] = {}
  for name, why in from_model.items():
    result[name] = _init_value(name, target[name], why)
    new_by_reason.setdefault(why, set()).add(name.split('/')[0])
  changes += [f'{", ".join(sorted(layers))} initialised afresh ({why})'
              for why, layers in new_by_reason.items()]
  if dropped:
    changes.append(f'{", ".join(sorted({n.split("/")[0] for n in dropped}))} left out (not in '
                   'the model)')
  if changes:
    progress.log(f'{source_desc} fitted to the model: {"; ".join(changes)}.')
  result = {name: result[name] for name in target}  # The model's order.

  if scanned:  # Back to the model's stacked blocks, in its order.
    stacked = _stack_on_host(result)
    result = {name: stacked[name] for name in flatten_params(target_tree)}
  tree = unflatten_params(result)
  tree = {'params': tree} if wrapped else tree
  return freeze(tree) if isinstance(init_params, FrozenDict) else tree
