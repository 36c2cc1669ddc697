"""Whole files from one weights format to another: what `python -m vit_jax.convert` does.

Formats come from the paths: `.npz` (published layout), `.safetensors` (timm
layout), or a directory (a vit_jax workdir holding orbax checkpoints).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors, files, models
from vit_jax.models.vit import stem_stride
from vit_jax.weights.fit import format_mismatches
from vit_jax.weights.layout import FlatParams, canonicalize, flatten_params, posemb_side
from vit_jax.weights.storage import (load_npz, load_safetensors, read_orbax, save_npz,
                                     save_safetensors, write_orbax)
from vit_jax.weights.timm import timm_to_flat, to_timm

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


def source_format(path: str) -> str:
  """`file_format` of a file to read; a PyTorch pickle is refused with what to do."""
  if os.path.splitext(path)[1].lower() in ('.pth', '.pt', '.bin'):  # torch is no dependency.
    raise errors.ConfigError(
        f'{path} is a PyTorch pickle; save its state dict as .safetensors first: python -c '
        '"import torch, safetensors.torch as s; '
        f"s.save_file(torch.load('{path}', map_location='cpu'), "
        f"'{os.path.splitext(path)[0]}.safetensors')\" (a checkpoint holding more than the state "
        "dict: take its ['model']).")
  return file_format(path)


def read_published(path: str, *, model: str | None = None, fall_back: bool = False,
                   ema: bool = False) -> FlatParams:
  """Any supported file -> flat params in the published layout (canonical names).

  `fall_back`: a workdir's newest readable checkpoint when its latest cannot be read;
  `ema`: a workdir's EMA weights.
  """
  kind = source_format(path)
  if ema and kind != 'orbax':
    raise errors.ConfigError(f'{path} is a .{kind} file, which holds one set of weights: EMA '
                             'weights are read from the workdir of a run with '
                             'config.ema_decay > 0.')
  if kind == 'orbax':
    return canonicalize(read_orbax(path, fall_back, ema))
  if kind == 'npz':
    return canonicalize(load_npz(path))
  state_dict = load_safetensors(path)
  if model is None:
    raise errors.ConfigError(f'Reading the timm file {path} needs --model NAME (e.g. --model '
                             'ViT-B_16): the number of attention heads is not stored in it.')
  return timm_to_flat(state_dict, num_heads=_model_config(model)['num_heads'])


def _model_config(name: str) -> dict:
  config = models.model_config(name)
  if 'patch_size' not in config:
    raise errors.ConfigError(f'{name} is not a ViT model; checkpoints convert only ViT, DeiT and '
                             'hybrid models.')
  return config


def check_against_model(flat: FlatParams, name: str) -> None:
  """Raises ValueError unless `flat` is exactly the params of model `name`.

  The class count, `pre_logits` width and image size are taken from the file.
  """
  config = _model_config(name)
  overrides = {'num_classes': flat['head/bias'].shape[0] if 'head/bias' in flat else 0}
  if 'pre_logits/bias' in flat:
    overrides['representation_size'] = flat['pre_logits/bias'].shape[0]
  model = models.get_model(name, **overrides)
  stride = config['patch_size'][0] * stem_stride(config.get('resnet_layers'))
  side = posemb_side(flat) or 16
  images = jnp.zeros((1, side * stride, side * stride, 3))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))['params']
  expected = {n: tuple(v.shape) for n, v in flatten_params(shapes).items()}
  found = {n: tuple(v.shape) for n, v in flat.items()}
  problems = [(n, found.get(n), expected.get(n)) for n in {**expected, **found}
              if found.get(n) != expected.get(n)]
  if problems:
    raise errors.ConfigError(f'The file is not a {name} checkpoint: {len(problems)} mismatched '
                             f'parameter(s) (file vs model: {format_mismatches(problems)}).')


def convert_file(src: str, dst: str, *, model: str | None = None,
                 overwrite: bool = False, fall_back: bool = False, ema: bool = False) -> None:
  """Converts SRC to DST (formats from the extensions); DST is written all or nothing.

  `ema`: SRC is a workdir whose EMA weights are converted.
  """
  dst_format = file_format(dst)
  source_format(src)
  if files.exists(dst) and not overwrite:
    raise FileExistsError(f'{dst} already exists; pass --overwrite to replace it.')
  flat = read_published(src, model=model, fall_back=fall_back, ema=ema)
  if model is not None:
    check_against_model(flat, model)
  if dst_format == 'npz':
    save_npz(dst, flat, overwrite=overwrite)
  elif dst_format == 'orbax':
    write_orbax(dst, flat, overwrite=overwrite)
  else:
    save_safetensors(dst, to_timm(flat), overwrite=overwrite)


def print_names(path: str, out=None, fall_back: bool = False) -> None:
  """Lists the arrays of a checkpoint file as stored: name, shape, dtype."""
  out = out or sys.stdout
  kind = source_format(path)
  if kind == 'npz':
    arrays = flatten_params(load_npz(path))
  elif kind == 'orbax':
    arrays = flatten_params(read_orbax(path, fall_back))
  else:
    arrays = load_safetensors(path)
  width = max((len(name) for name in arrays), default=0)
  for name, value in arrays.items():
    print(f'{name:<{width}}  {str(tuple(value.shape)):<20} {value.dtype}', file=out)
  total = sum(int(np.prod(value.shape)) for value in arrays.values())
  print(f'{len(arrays)} arrays, {total:,} parameters', file=out)
