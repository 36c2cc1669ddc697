"""A small Transformer that learns to normalise dates ("le 3 mars 1979" -> 1979-03-03).

The data are generated on the fly (no download):
python -m vit_jax.main --config=configs/transformer_dates.py --workdir=runs/dates
echo "Saturday, 3 March 1979" | python -m vit_jax.main \
    --config=configs/transformer_dates.py --workdir=runs/dates --config.trainer=translate
"""

from vit_jax.train.config import translation_config


def get_config():
  config = translation_config('Transformer-testing')
  config.model.embed_dim = 128
  config.model.mlp_dim = 256
  config.model.num_heads = 4
  config.model.num_layers = 2
  config.model.dropout_rate = 0.0
  config.data.dataset = 'dates'
  config.data.tokenizer = 'chars'
  config.data.max_length = 48
  config.batch_size = 64
  config.eval_batch_size = 256
  config.total_steps = 800
  config.optimizer.name = 'adamw'
  config.optimizer.b2 = 0.98
  config.optimizer.schedule = 'cosine'
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 200
  config.label_smoothing = 0.0
  config.beam_size = 1
  config.decode_batch_size = 256
  config.log_every = 100
  config.eval_every = 400
  config.checkpoint_every = 400
  return config
