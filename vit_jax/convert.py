"""Conversion between the published ViT layout and timm's (PyTorch) state_dict names.

No torch needed: state dicts are {name: numpy array} and are stored as
`.safetensors` through `safetensors.numpy`. One rule table, `RULES`, maps our
parameter names to timm's and is used in both directions.

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

Command line:
  python -m vit_jax.convert SRC DST [--model NAME] [--overwrite]
  python -m vit_jax.convert --print SRC
converts between `.npz` (published layout) and `.safetensors` (timm layout),
choosing the formats from the extensions.
"""

import argparse
import math
import os
import re
import sys
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import safetensors.numpy

from vit_jax import checkpoint, errors, files
from vit_jax.checkpoint import EXTRA_TOKENS, POSEMB, FlatParams

# ----------------------------------------------------------------------------
# The mapping.


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
  """Our params (nested or flat, any layout `checkpoint.canonicalize` accepts) -> timm.

  Returns:
    {timm state_dict name: contiguous float32 array}.

  Raises:
    ValueError: a parameter that has no timm counterpart.
  """
  flat = checkpoint.canonicalize(params)
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
  for name, value in checkpoint.flatten_params(params).items():
    if name.endswith('/query/kernel'):
      return int(value.shape[-2])  # (D, N, H), or (L, D, N, H) when scanned.
  raise errors.ConfigError('The params have no attention `query/kernel`; they are not a ViT.')


def from_timm(state_dict: Mapping[str, Any], init_params: Mapping[str, Any], *,
              reinit_head: bool = False, grid_size: tuple[int, int] | None = None) -> Any:
  """timm state_dict -> params for the model of `init_params`.

  Renames with `timm_to_flat`, then fits with `checkpoint.load_pretrained`
  (class count, resolution, pre_logits, scanned blocks; mismatches are
  reported under our names).
  """
  flat = timm_to_flat(state_dict, num_heads=num_heads_of(init_params))
  return checkpoint.load_pretrained(flat, init_params, reinit_head=reinit_head,
                                    grid_size=grid_size)


# ----------------------------------------------------------------------------
# Files.


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
  try:
    if files.is_remote(path):
      return safetensors.numpy.load(files.read_bytes(path))
    return safetensors.numpy.load_file(path)
  except Exception as e:  # safetensors raises its own SafetensorError.
    raise errors.BadFileError(f'Cannot read checkpoint {path}: {type(e).__name__}: {e}. The file '
                              'is truncated or corrupt, or not .safetensors; download or write '
                              'it again.') from e


# ----------------------------------------------------------------------------
# Command line.

FORMATS = {'.npz': 'npz', '.safetensors': 'safetensors'}


def file_format(path: str) -> str:
  """'npz' or 'safetensors' from the extension; 'orbax' for a directory (a vit_jax workdir)."""
  if os.path.isdir(path) or path.endswith('/') or not os.path.splitext(path)[1]:
    return 'orbax'
  extension = os.path.splitext(path)[1].lower()
  if extension not in FORMATS:
    raise errors.ConfigError(f'Cannot tell the format of {path} from its extension; use one of '
                             f'{sorted(FORMATS)}, or a directory for an orbax checkpoint.')
  return FORMATS[extension]


def read_orbax(path: str) -> dict:
  """The params of the latest orbax checkpoint in the workdir `path` (nested, numpy)."""
  from vit_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(os.path.join(path, 'checkpoints')):
    raise errors.ConfigError(f'{path} is not a vit_jax workdir: it has no checkpoints/ directory.')
  return checkpointing.restore_params(path)[0]


def write_orbax(path: str, params: Mapping[str, Any], *, overwrite: bool = False) -> None:
  """Writes `params` as a workdir holding one orbax checkpoint, PATH/checkpoints/0.

  The result loads with `--config.pretrained=PATH`. It is built beside `path`
  and renamed into place, so a failure leaves `path` as it was.
  """
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  from vit_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(path)
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(f'{path} already exists; pass --overwrite to replace it.')
  parent = os.path.dirname(path)
  if not os.path.isdir(parent):
    raise errors.MissingFileError(f'Cannot write {path}: directory {parent} does not exist.')
  staging = tempfile.mkdtemp(dir=parent, prefix=f'.{os.path.basename(path)}.')
  try:
    writer = checkpointing.Checkpointer(staging, keep=1)
    writer.save(0, {'params': checkpoint.unflatten_params(dict(params))})
    writer.close()
    if os.path.exists(path):
      shutil.rmtree(path)
    os.replace(staging, path)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def read_published(path: str, *, model: str | None = None) -> FlatParams:
  """Any supported file -> flat params in the published layout (canonical names)."""
  kind = file_format(path)
  if kind == 'orbax':
    return checkpoint.canonicalize(read_orbax(path))
  if kind == 'npz':
    return checkpoint.canonicalize(checkpoint.load_npz(path))
  state_dict = load_safetensors(path)
  if model is None:
    raise errors.ConfigError(f'Reading the timm file {path} needs --model NAME (e.g. --model '
                             'ViT-B_16): the number of attention heads is not stored in it.')
  return timm_to_flat(state_dict, num_heads=_model_config(model)['num_heads'])


def _model_config(name: str) -> dict:
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  config = models.model_config(name)
  if 'patch_size' not in config:
    raise errors.ConfigError(f'{name} is not a ViT model; checkpoints convert only ViT, DeiT and '
                             'hybrid models.')
  return config


def check_against_model(flat: FlatParams, name: str) -> None:
  """Raises ValueError unless `flat` is exactly the params of model `name`.

  The class count, `pre_logits` width and image size are taken from the file.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  config = _model_config(name)
  overrides = {'num_classes': flat['head/bias'].shape[0] if 'head/bias' in flat else 0}
  if 'pre_logits/bias' in flat:
    overrides['representation_size'] = flat['pre_logits/bias'].shape[0]
  model = models.get_model(name, **overrides)
  from vit_jax.models.vit import stem_stride  # pylint: disable=g-import-not-at-top
  stride = config['patch_size'][0] * stem_stride(config.get('resnet_layers'))
  side = 16
  if POSEMB in flat:
    grid_tokens = flat[POSEMB].shape[1] - sum(token in flat for token in EXTRA_TOKENS)
    side = math.isqrt(max(grid_tokens, 1))
  images = jnp.zeros((1, side * stride, side * stride, 3))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))['params']
  expected = {n: tuple(v.shape) for n, v in checkpoint.flatten_params(shapes).items()}
  found = {n: tuple(v.shape) for n, v in flat.items()}
  problems = [(n, found.get(n), expected.get(n)) for n in {**expected, **found}
              if found.get(n) != expected.get(n)]
  if problems:
    raise errors.ConfigError(f'The file is not a {name} checkpoint: {len(problems)} mismatched '
                             'parameter(s) (file vs model: '
                             f'{checkpoint.format_mismatches(problems)}).')


def convert_file(src: str, dst: str, *, model: str | None = None,
                 overwrite: bool = False) -> None:
  """Converts SRC to DST (formats from the extensions); DST is written all or nothing."""
  dst_format = file_format(dst)
  file_format(src)
  if files.exists(dst) and not overwrite:
    raise FileExistsError(f'{dst} already exists; pass --overwrite to replace it.')
  flat = read_published(src, model=model)
  if model is not None:
    check_against_model(flat, model)
  if dst_format == 'npz':
    checkpoint.save_npz(dst, flat, overwrite=overwrite)
  elif dst_format == 'orbax':
    write_orbax(dst, flat, overwrite=overwrite)
  else:
    save_safetensors(dst, to_timm(flat), overwrite=overwrite)


def print_names(path: str, out=None) -> None:
  """Lists the arrays of a checkpoint file as stored: name, shape, dtype."""
  out = out or sys.stdout
  kind = file_format(path)
  if kind == 'npz':
    arrays = checkpoint.flatten_params(checkpoint.load_npz(path))
  elif kind == 'orbax':
    arrays = checkpoint.flatten_params(read_orbax(path))
  else:
    arrays = load_safetensors(path)
  width = max((len(name) for name in arrays), default=0)
  for name, value in arrays.items():
    print(f'{name:<{width}}  {str(tuple(value.shape)):<20} {value.dtype}', file=out)
  total = sum(int(np.prod(value.shape)) for value in arrays.values())
  print(f'{len(arrays)} arrays, {total:,} parameters', file=out)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.convert',
      description='Convert ViT checkpoints between the published .npz layout, timm '
                  '.safetensors and orbax (a vit_jax workdir); formats come from the paths.')
  parser.add_argument('src', help='checkpoint to read (.npz, .safetensors or a workdir)')
  parser.add_argument('dst', nargs='?', help='where to write (.npz, .safetensors or a '
                      'directory for orbax)')
  parser.add_argument('--model', help='registry model name, e.g. ViT-B_16; needed to read '
                      'a timm file, and checks the converted parameters when given')
  parser.add_argument('--overwrite', action='store_true', help='replace an existing DST')
  parser.add_argument('--print', dest='print_names', action='store_true',
                      help='list the names and shapes of the arrays in SRC and exit')
  args = parser.parse_args(argv)
  try:
    if args.print_names:
      print_names(args.src)
      return 0
    if args.dst is None:
      parser.error('give DST, or --print to list the arrays of SRC')
    convert_file(args.src, args.dst, model=args.model, overwrite=args.overwrite)
  except BrokenPipeError:  # `--print ... | head`: the reader has all it wants.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
  except (errors.UserError, FileExistsError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(f'Wrote {args.dst}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
