"""Model configs: the registry table (vit_jax/models/registry.py) as ConfigDicts.

Use as `--config=configs/models.py:ViT-B_16`, or call `get_config(name)` from
another config file. `name` selects the registry entry; every other field
overrides that entry's setting when the trainer calls `get_model`.
"""

import ml_collections

from vit_jax.models import registry


def get_config(name: str = 'ViT-B_16') -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(registry.model_config(name))
  config.name = name  # Registry entry; see `vit_jax.models.model_names()`.
  return config
