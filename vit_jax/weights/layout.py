"""Names and layouts of Google's published ViT `.npz` checkpoints.

The layout is one float32 array per parameter, keyed by
its path joined with '/': `cls`, `embedding/kernel`,
`Transformer/posembed_input/pos_embedding`,
`Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1,
LayerNorm_2, MlpBlock_3}/...`, `Transformer/encoder_norm`, [`pre_logits`],
`head`; hybrids add `conv_root`, `gn_root`, `block{s}/unit{u}/...`; DeiT adds
`dist` and `head_dist`. Those are also the names of our Flax parameters.

Variants in the wild, all mapped to that layout by `canonicalize`: sub-modules
numbered per type (`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`),
one stacked `encoderblock` with a leading layer axis (`scan_layers`), and
(1, 1, 1, C) GroupNorm scale/bias.
"""

import math
import re
from typing import Any, Mapping

import numpy as np

from vit_jax import errors
from vit_jax.models.layers import unstack_layers
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


def as_float32(name: str, value: Any) -> np.ndarray:
  """`value` as a float32 numpy array; a non-number dtype is an error naming `name`."""
  value = np.asarray(value)
  if not (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)
          or value.dtype.name == 'bfloat16'):
    raise ValueError(f'Parameter {name!r} has dtype {value.dtype}, not a number type; '
                     'it cannot be a model parameter.')
  return value.astype(np.float32, copy=False)


def is_stacked_name(name: str) -> bool:
  """Whether `name` is inside a stacked (scanned) `encoderblock`."""
  return STACKED_BLOCK in name.split('/')


def unstack_blocks(flat: FlatParams) -> FlatParams:
  """`.../encoderblock/x` arrays with a leading layer axis -> `.../encoderblock_{i}/x`.

  Splits with `vit_jax.models.layers.unstack_layers`, which indexes each leaf
  (`value[i]`); leaves may be numpy arrays or anything indexable alike.
  """
  stacked = [value for name, value in flat.items() if is_stacked_name(name)]
  if not stacked:
    return dict(flat)
  if any(_BLOCK_SEGMENT.fullmatch(s) for name in flat for s in name.split('/')):
    raise ValueError('The parameters hold both stacked (`encoderblock/...`) and per-layer '
                     '(`encoderblock_{i}/...`) blocks; keep one of the two.')
  num_layers = {value.shape[0] for value in stacked}
  if len(num_layers) != 1:
    raise ValueError(f'Stacked `encoderblock` arrays disagree on the number of layers '
                     f'(leading axis sizes {sorted(num_layers)}).')
  return flatten_params(unstack_layers(unflatten_params(flat), STACKED_BLOCK))


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


_OPTIMIZER_TARGET = 'opt/target/'  # flax.optim's checkpoints: the params under the optimizer.


def canonicalize(params: Mapping[str, Any]) -> FlatParams:
  """Any accepted checkpoint layout -> flat float32 arrays under the published names.

  Unstacks `encoderblock` arrays into `encoderblock_{i}`, renames per-type
  numbered block modules (`MultiHeadDotProductAttention_0`, `LayerNorm_1`,
  `MlpBlock_0`) to the published ones, and reshapes (1, 1, 1, C) GroupNorm
  scale/bias to (C,). `params` may be nested or already flat ('/'-joined keys),
  and wrapped as {'params': ...} (big_vision) or as `flax.optim`'s
  {'opt': {'target': ..., 'state': ...}} (some published files: the optimizer state is
  left out).
  """
  if set(params) == {'params'} and isinstance(params['params'], Mapping):
    params = params['params']
  flat = flatten_params(params)
  if any(name.startswith(_OPTIMIZER_TARGET) for name in flat):
    flat = {name.removeprefix(_OPTIMIZER_TARGET): value for name, value in flat.items()
            if name.startswith(_OPTIMIZER_TARGET)}
  flat = {name: as_float32(name, value) for name, value in flat.items()}
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


def num_prefix_tokens(flat: Mapping[str, Any]) -> int:
  """How many of the tokens before the patch grid (`EXTRA_TOKENS`) flat params hold."""
  return sum(token in flat for token in EXTRA_TOKENS)


def posemb_side(flat: Mapping[str, Any]) -> int | None:
  """Side of the position embedding's square patch grid; None without one, or not square."""
  if POSEMB not in flat:
    return None
  grid = flat[POSEMB].shape[1] - num_prefix_tokens(flat)
  side = math.isqrt(max(grid, 0))
  return side if side and side * side == grid else None


def head_fields(flat: Mapping[str, Any], source: str) -> dict:
  """The model fields that a classifier's weights fix: `num_classes` (the head's width) and
  `representation_size` (the pre-logits layer's, as in the ImageNet-21k checkpoints; None
  without one)."""
  if 'head/bias' not in flat:
    raise errors.ConfigError(f'{source} has no classification head (head/bias): it is a feature '
                             'extractor, which predicts no classes; give a fine-tuned classifier.')
  pre_logits = flat.get(PRE_LOGITS_PREFIX + 'bias')
  return {'num_classes': int(flat['head/bias'].shape[-1]),
          'representation_size': None if pre_logits is None else int(pre_logits.shape[-1])}
