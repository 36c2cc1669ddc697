"""The model registry: one table from model name to module class and settings."""

import dataclasses
import difflib
import typing
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax.numpy as jnp

from vit_jax import errors

from vit_jax.models.transformer import Transformer
from vit_jax.models.vit import VisionTransformer

# Transformer shapes of the ViT family: hidden size, MLP size, heads, layers.
_VIT_SIZES = {
    'Ti': dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    'S': dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    'B': dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    'L': dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    'H': dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
    'testing': dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2),
}


def _vit(size: str, patch: int, **overrides) -> tuple[type[nn.Module], dict]:
  return VisionTransformer, dict(**_VIT_SIZES[size], patch_size=(patch, patch),
                                 **overrides)


def _transformer(**settings) -> tuple[type[nn.Module], dict]:
  return Transformer, settings


# name -> (module class, settings). Hybrids patch-embed the ResNet feature map;
# DeiT models are the distilled variants (class + distillation token).
MODELS: dict[str, tuple[type[nn.Module], dict]] = {
    'ViT-Ti_16': _vit('Ti', 16),
    'ViT-S_16': _vit('S', 16),
    'ViT-S_32': _vit('S', 32),
    'ViT-B_16': _vit('B', 16),
    'ViT-B_32': _vit('B', 32),
    'ViT-L_16': _vit('L', 16),
    'ViT-L_32': _vit('L', 32),
    'ViT-H_14': _vit('H', 14),
    'ViT-testing': _vit('testing', 4),
    'R50+ViT-B_16': _vit('B', 1, resnet_layers=(3, 4, 9)),
    'R26+ViT-S_32': _vit('S', 1, resnet_layers=(2, 2, 2, 2)),
    'R+ViT-Ti_16': _vit('Ti', 8, resnet_layers=()),
    'R+ViT-testing': _vit('testing', 1, resnet_layers=(1, 1), resnet_width_factor=0.5),
    'DeiT-Ti_16': _vit('Ti', 16, classifier='token_distill', droppath_rate=0.1),
    'DeiT-S_16': _vit('S', 16, classifier='token_distill', droppath_rate=0.1),
    'DeiT-B_16': _vit('B', 16, classifier='token_distill', droppath_rate=0.1),
    'DeiT-testing': _vit('testing', 4, classifier='token_distill', droppath_rate=0.1),
    'Transformer-base': _transformer(embed_dim=512, mlp_dim=2048, num_heads=8,
                                     num_layers=6, dropout_rate=0.1),
    'Transformer-big': _transformer(embed_dim=1024, mlp_dim=4096, num_heads=16,
                                    num_layers=6, dropout_rate=0.3),
    'Transformer-testing': _transformer(embed_dim=32, mlp_dim=64, num_heads=4,
                                        num_layers=2, dropout_rate=0.1),
}

# The argument each family needs from the caller.
_REQUIRED = {VisionTransformer: 'num_classes', Transformer: 'vocab_size'}
# Fields that the caller (the trainer's task) decides, so a config never sets them.
_SET_BY_CALLER = {VisionTransformer: ('num_classes',),
                  Transformer: ('vocab_size', 'output_vocab_size', 'cached_decoding')}
_DTYPE_FIELDS = ('dtype', 'param_dtype')


class Field(NamedTuple):
  """A setting of a registered model: its name, value in the registry entry, and type."""
  name: str
  default: Any  # The entry's value, else the module's default; dtypes as names ('float32').
  type: type  # int, float, bool, str or tuple (also for fields whose default is None).


def model_names() -> list[str]:
  return list(MODELS)


def model_family(name: str) -> str:
  """The module class of model `name`: 'VisionTransformer' or 'Transformer'."""
  return _lookup(name)[0].__name__


def _lookup(name: str) -> tuple[type[nn.Module], dict]:
  if name not in MODELS:
    close = difflib.get_close_matches(name, MODELS, n=3)
    hint = f' Did you mean {", ".join(close)}?' if close else ''
    raise errors.ConfigError(f'Unknown model {name!r}.{hint} Known models: '
                             f'{", ".join(MODELS)}.')
  return MODELS[name]


def _field_type(annotation: Any, default: Any) -> type:
  """The config type of a module field: a Sequence is a tuple, Optional[X] is X."""
  if default is not None and not isinstance(default, (list, tuple)):
    return type(default)
  options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
  origin = typing.get_origin(options[0]) or options[0]
  if origin in (tuple, list) or (isinstance(origin, type) and issubclass(origin, Sequence)):
    return tuple
  return origin


def model_fields(name: str) -> list[Field]:
  """Every setting of model `name` that a config may change, in the module's order.

  The fields of the module class except those the caller decides (the class count,
  the vocabulary, cached decoding), with the registry entry's values.
  """
  module_cls, settings = _lookup(name)
  fields = []
  for field in dataclasses.fields(module_cls):
    if field.name in ('parent', 'name') or field.name in _SET_BY_CALLER[module_cls]:
      continue
    default = settings.get(field.name, field.default)
    if field.name in _DTYPE_FIELDS:
      fields.append(Field(field.name, jnp.dtype(default).name, str))
      continue
    if isinstance(default, list):
      default = tuple(default)
    fields.append(Field(field.name, default, _field_type(field.type, default)))
  return fields


def model_config(name: str) -> dict:
  """The settings of `name`: every field of `model_fields` with its value."""
  return {field.name: field.default for field in model_fields(name)}


def _dtype(field: str, value: Any) -> Any:
  if not isinstance(value, str):
    return value
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise errors.ConfigError(f"{field}={value!r} is not a floating-point dtype; use 'float32', "
                             "'bfloat16' or 'float16'.")
  return dtype


def get_model(name: str, **kwargs) -> nn.Module:
  """Returns the module registered as `name`, with `kwargs` overriding its settings.

  Image models need `num_classes`, Transformer models `vocab_size`; any field
  of the module (e.g. `dtype`, `scan_layers`, `dropout_rate`) may be given;
  dtypes also by name ('bfloat16').
  """
  module_cls, settings = _lookup(name)
  fields = {f.name for f in dataclasses.fields(module_cls)} - {'parent', 'name'}
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise errors.ConfigError(f'{module_cls.__name__} ({name}) has no option(s) {unknown}; '
                     f'valid options: {sorted(fields)}.')
  required = _REQUIRED[module_cls]
  if required not in kwargs:
    raise ValueError(f'get_model({name!r}) needs {required}=..., e.g. '
                     f'get_model({name!r}, {required}=1000).')
  kwargs = {key: _dtype(key, value) if key in _DTYPE_FIELDS else value
            for key, value in kwargs.items()}
  return module_cls(**{**settings, **kwargs})
