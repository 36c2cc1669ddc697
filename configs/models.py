"""Model configs: the registry table (vit_jax/models/registry.py) as ConfigDicts.

Use as `--config=configs/models.py:ViT-B_16` to inspect one, or call
`vit_jax.train.config.model_config(name)` in a run config. `name` selects the registry
entry; every other field overrides that entry's setting when the trainer builds the model.
"""

from vit_jax.train.config import model_config


def get_config(name: str = 'ViT-B_16'):
  return model_config(name)
