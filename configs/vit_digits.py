"""A small ViT trained from scratch on scikit-learn's embedded 8x8 digits (no download).

python -m vit_jax.main --config=configs/vit_digits.py --workdir=runs/digits
"""

from vit_jax.train.config import classification_config


def get_config():
  config = classification_config('ViT-testing')
  config.model.patch_size = (2, 2)  # 8x8 digits -> 16 patches + the class token.
  config.model.hidden_size = 64
  config.model.mlp_dim = 128
  config.model.num_heads = 4
  config.model.num_layers = 4
  config.model.dropout_rate = 0.1
  config.data.dataset = 'digits'
  config.data.image_size = 8
  config.batch_size = 128
  config.eval_batch_size = 128
  config.total_steps = 3000
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 0.05
  config.label_smoothing = 0.1
  config.log_every = 100
  config.eval_every = 1000
  config.checkpoint_every = 500
  return config
