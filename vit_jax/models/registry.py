"""The model registry: one table from model name to module class and settings."""

import dataclasses
import difflib

import flax.linen as nn

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


def model_names() -> list[str]:
  return list(MODELS)


def _lookup(name: str) -> tuple[type[nn.Module], dict]:
  if name not in MODELS:
    close = difflib.get_close_matches(name, MODELS, n=3)
    hint = f' Did you mean {", ".join(close)}?' if close else ''
    raise ValueError(f'Unknown model {name!r}.{hint} Known models: '
                     f'{", ".join(MODELS)}.')
  return MODELS[name]


def model_config(name: str) -> dict:
  """The registry settings of `name` (a copy), without the caller's arguments."""
  return dict(_lookup(name)[1])


def get_model(name: str, **kwargs) -> nn.Module:
  """Returns the module registered as `name`, with `kwargs` overriding its settings.

  Image models need `num_classes`, Transformer models `vocab_size`; any field
  of the module (e.g. `dtype`, `scan_layers`, `dropout_rate`) may be given.
  """
  module_cls, settings = _lookup(name)
  fields = {f.name for f in dataclasses.fields(module_cls)} - {'parent', 'name'}
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise ValueError(f'{module_cls.__name__} ({name}) has no option(s) {unknown}; '
                     f'valid options: {sorted(fields)}.')
  required = _REQUIRED[module_cls]
  if required not in kwargs:
    raise ValueError(f'get_model({name!r}) needs {required}=..., e.g. '
                     f'get_model({name!r}, {required}=1000).')
  return module_cls(**{**settings, **kwargs})
