"""Conversion between the published ViT layout and timm's (PyTorch) state_dict names.

No torch needed: state dicts are {name: numpy array} (stored as `.safetensors`
by `storage`). One rule table, `RULES`, maps our parameter names to timm's and
is used in both directions.

timm names (checked against timm 1.0's `vision_transformer.py`,
`vision_transformer_hybrid.py`, `deit.py` and `resnetv2.py`):
  ViT:     cls_token, pos_embed (class token first), patch_embed.proj.{weight,bias},
           blocks.{i}.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}.*, norm.*,
           head.*; `pre_logits.fc.*` only in old timm versions that kept it.
  DeiT:    + dist_token and head_dist.*; pos_embed holds both tokens (cls, dist).
  Hybrid:  patch_embed.backbone.stem.{conv.weight, norm.*} and
           patch_embed.backbone.stages.{s}.blocks.{u}.{conv1, norm1, conv2, norm2, conv3,
           norm3, downsample.conv, downsample.norm}.* (0-based s, u; ours are 1-based),
           then patch_embed.proj.*. A stem-only backbone (`vit_tiny_r_s16_p8_*`,
           our R+ViT-Ti) is timm's bare stem: patch_embed.backbone.{conv, norm}.*.

Numerics that differ between the two implementations with the same weights:
timm's MLP uses the exact (erf) GELU, ours the tanh approximation (~1e-4 on the
logits); timm's hybrid backbone standardises conv weights with eps 1e-8 (ours
1e-5) and its GroupNorm uses eps 1e-5 (Flax 1e-6).
"""

import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from vit_jax import errors
from vit_jax.weights.fit import load_pretrained
from vit_jax.weights.layout import POSEMB, FlatParams, canonicalize, flatten_params


class Transform(NamedTuple):
  """How arrays change between the layouts.

  to_timm: our arrays (one per name of the rule) -> the timm array.
  from_timm: (timm array, num_heads) -> our arrays, in the rule's name order.
  """
  to_timm: Callable[[list[np.ndarray]], np.ndarray]
  from_timm: Callable[[np.ndarray, int], list[np.ndarray]]


SAME = Transform(lambda xs: xs[0], lambda x, heads: [x])
# Dense kernel (in, out) <-> torch Linear weight (out, in).
DENSE = Transform(lambda xs: xs[0].T, lambda x, heads: [x.T])
# Conv kernel HWIO <-> OIHW.
CONV = Transform(lambda xs: xs[0].transpose(3, 2, 0, 1),
                 lambda x, heads: [x.transpose(2, 3, 1, 0)])
# query/key/value kernels (D, N, H) each <-> fused qkv weight (3*N*H, D), rows (qkv, N, H).
QKV_KERNEL = Transform(
    lambda xs: np.concatenate([x.reshape(x.shape[0], -1).T for x in xs]),
    lambda x, heads: [w.T.reshape(w.shape[1], heads, -1) for w in np.split(x, 3)])
# query/key/value biases (N, H) each <-> fused qkv bias (3*N*H,).
QKV_BIAS = Transform(lambda xs: np.concatenate([x.reshape(-1) for x in xs]),
                     lambda x, heads: [b.reshape(heads, -1) for b in np.split(x, 3)])
# Attention output kernel (N, H, D) <-> proj weight (D, N*H).
OUT_KERNEL = Transform(lambda xs: xs[0].reshape(-1, xs[0].shape[-1]).T,
                       lambda x, heads: [x.T.reshape(heads, -1, x.shape[0])])


class Rule(NamedTuple):
  """Our names (with {i} layer, {s} stage, {u} unit, {r} conv index) <-> one timm name."""
  ours: tuple[str, ...]
  timm: str
  transform: Transform


_BLOCK = 'Transformer/encoderblock_{i}/'
_ATTN = _BLOCK + 'MultiHeadDotProductAttention_1/'
_UNIT = 'block{s}/unit{u}/'
_TIMM_STEM = 'patch_embed.backbone.stem.'
_TIMM_STEM_ONLY = 'patch_embed.backbone.'  # timm's backbone when it is just the stem.
_TIMM_UNIT = 'patch_embed.backbone.stages.{s}.blocks.{u}.'


def _affine(ours: str, timm: str) -> list[Rule]:
  """Norm layer: our scale/bias <-> timm weight/bias."""
  return [Rule((ours + 'scale',), timm + 'weight', SAME),
          Rule((ours + 'bias',), timm + 'bias', SAME)]


def _dense(ours: str, timm: str) -> list[Rule]:
  return [Rule((ours + 'kernel',), timm + 'weight', DENSE),
          Rule((ours + 'bias',), timm + 'bias', SAME)]


RULES: tuple[Rule, ...] = (
    Rule(('cls',), 'cls_token', SAME),
    Rule(('dist',), 'dist_token', SAME),
    Rule((POSEMB,), 'pos_embed', SAME),
    Rule(('embedding/kernel',), 'patch_embed.proj.weight', CONV),
    Rule(('embedding/bias',), 'patch_embed.proj.bias', SAME),
    Rule(('conv_root/kernel',), _TIMM_STEM + 'conv.weight', CONV),
    *_affine('gn_root/', _TIMM_STEM + 'norm.'),
    Rule((_UNIT + 'conv{r}/kernel',), _TIMM_UNIT + 'conv{r}.weight', CONV),
    *_affine(_UNIT + 'gn{r}/', _TIMM_UNIT + 'norm{r}.'),
    Rule((_UNIT + 'conv_proj/kernel',), _TIMM_UNIT + 'downsample.conv.weight', CONV),
    *_affine(_UNIT + 'gn_proj/', _TIMM_UNIT + 'downsample.norm.'),
    *_affine(_BLOCK + 'LayerNorm_0/', 'blocks.{i}.norm1.'),
    Rule(tuple(_ATTN + f'{part}/kernel' for part in ('query', 'key', 'value')),
         'blocks.{i}.attn.qkv.weight', QKV_KERNEL),
    Rule(tuple(_ATTN + f'{part}/bias' for part in ('query', 'key', 'value')),
         'blocks.{i}.attn.qkv.bias', QKV_BIAS),
    Rule((_ATTN + 'out/kernel',), 'blocks.{i}.attn.proj.weight', OUT_KERNEL),
    Rule((_ATTN + 'out/bias',), 'blocks.{i}.attn.proj.bias', SAME),
    *_affine(_BLOCK + 'LayerNorm_2/', 'blocks.{i}.norm2.'),
    *_dense(_BLOCK + 'MlpBlock_3/Dense_0/', 'blocks.{i}.mlp.fc1.'),
    *_dense(_BLOCK + 'MlpBlock_3/Dense_1/', 'blocks.{i}.mlp.fc2.'),
    *_affine('Transformer/encoder_norm/', 'norm.'),
    *_dense('pre_logits/', 'pre_logits.fc.'),
    *_dense('head/', 'head.'),
    *_dense('head_dist/', 'head_dist.'),
)

# Our stage/unit numbers start at 1, timm's at 0; layer and conv numbers agree.
_OUR_OFFSETS = {'s': 1, 'u': 1}
_PLACEHOLDER = re.compile(r'\{(\w)\}')


def _pattern_regex(pattern: str) -> re.Pattern:
  parts = _PLACEHOLDER.split(pattern)  # literal, name, literal, name, ..., literal
  return re.compile(''.join(re.escape(part) if k % 2 == 0 else rf'(?P<{part}>\d+)'
                            for k, part in enumerate(parts)))


_OURS_REGEX = [_pattern_regex(rule.ours[0]) for rule in RULES]
_TIMM_REGEX = [_pattern_regex(rule.timm) for rule in RULES]


def _our_names(rule: Rule, index: Mapping[str, int]) -> list[str]:
  shown = {k: v + _OUR_OFFSETS.get(k, 0) for k, v in index.items()}
  return [pattern.format(**shown) for pattern in rule.ours]


def _stem_is_whole_backbone(timm_names: Sequence[str]) -> bool:
  return not any(name.startswith('patch_embed.backbone.stages.') for name in timm_names)


def to_timm(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Our params (nested or flat, any layout `canonicalize` accepts) -> timm.

  Returns:
    {timm state_dict name: contiguous float32 array}.

  Raises:
    ValueError: a parameter that has no timm counterpart.
  """
  flat = canonicalize(params)
  state_dict: dict[str, np.ndarray] = {}
  used: set[str] = set()
  for rule, regex in zip(RULES, _OURS_REGEX, strict=True):
    for name in flat:
      match = regex.fullmatch(name)
      if not match:
        continue
      index = {k: int(v) - _OUR_OFFSETS.get(k, 0) for k, v in match.groupdict().items()}
      names = _our_names(rule, index)
      missing = [n for n in names if n not in flat]
      if missing:
        raise errors.BadFileError(f'{name} has no partner(s) {missing}: timm\'s '
                                  f'{rule.timm.format(**index)} is made of {names} together.')
      state_dict[rule.timm.format(**index)] = np.ascontiguousarray(
          rule.transform.to_timm([flat[n] for n in names]), dtype=np.float32)
      used.update(names)
  unmapped = [name for name in flat if name not in used]
  if any(name.startswith('decoder/') for name in unmapped):
    raise errors.BadFileError('These are a seq2seq Transformer\'s weights, which timm has no '
                              'model for: convert them to .npz or to an orbax directory instead.')
  if unmapped:
    raise errors.BadFileError(f'No timm name for {len(unmapped)} parameter(s): {unmapped[:10]}. '
                              'Only ViT, DeiT and ResNet-hybrid parameters in the published '
                              'layout can be converted.')
  if _stem_is_whole_backbone(list(state_dict)):
    state_dict = {(_TIMM_STEM_ONLY + name[len(_TIMM_STEM):] if name.startswith(_TIMM_STEM)
                   else name): value for name, value in state_dict.items()}
  return state_dict


def timm_to_flat(state_dict: Mapping[str, Any], *, num_heads: int) -> FlatParams:
  """timm state_dict -> flat float32 params under the published names (no model check).

  Args:
    state_dict: {timm name: array}; numpy arrays, or CPU torch tensors.
    num_heads: attention heads of the model (not stored in timm's fused qkv).

  Raises:
    ValueError: a timm parameter without a published counterpart (e.g.
      fc_norm, LayerScale, register tokens), or shapes that do not split into
      `num_heads` heads.
  """
  arrays = {name: np.asarray(value, np.float32) for name, value in state_dict.items()}
  if _stem_is_whole_backbone(list(arrays)):
    arrays = {(_TIMM_STEM + name[len(_TIMM_STEM_ONLY):]
               if name.startswith(_TIMM_STEM_ONLY) and not name.startswith(_TIMM_STEM)
               else name): value for name, value in arrays.items()}
  flat: FlatParams = {}
  unknown = []
  for timm_name, value in arrays.items():
    found = next(((rule, m) for rule, regex in zip(RULES, _TIMM_REGEX, strict=True)
                  if (m := regex.fullmatch(timm_name))), None)
    if found is None:
      unknown.append(timm_name)
      continue
    rule, match = found
    names = _our_names(rule, {k: int(v) for k, v in match.groupdict().items()})
    try:
      values = rule.transform.from_timm(value, num_heads)
    except ValueError as e:
      raise errors.BadFileError(f'timm {timm_name} of shape {value.shape} does not split into '
                                f'{names} with num_heads={num_heads}: {e}') from e
    flat.update(zip(names, values, strict=True))
  if unknown:
    raise errors.BadFileError(f'{len(unknown)} timm parameter(s) have no counterpart in the '
                              f'published ViT layout: {unknown[:10]}. The Flax models have no '
                              'fc_norm, LayerScale, register tokens, q/k norms or pre-norm.')
  return flat


def num_heads_of(params: Mapping[str, Any]) -> int:
  """The attention head count of (initialised or shape-only) ViT params."""
  for name, value in flatten_params(params).items():
    if name.endswith('/query/kernel'):
      return int(value.shape[-2])  # (D, N, H), or (L, D, N, H) when scanned.
  raise errors.ConfigError('The params have no attention `query/kernel`; they are not a ViT.')


def from_timm(state_dict: Mapping[str, Any], init_params: Mapping[str, Any], *,
              reinit_head: bool = False, grid_size: tuple[int, int] | None = None) -> Any:
  """timm state_dict -> params for the model of `init_params`.

  Renames with `timm_to_flat`, then fits with `load_pretrained`
  (class count, resolution, pre_logits, scanned blocks; mismatches are
  reported under our names).
  """
  flat = timm_to_flat(state_dict, num_heads=num_heads_of(init_params))
  return load_pretrained(flat, init_params, reinit_head=reinit_head, grid_size=grid_size)
