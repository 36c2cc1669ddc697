"""A Transformer on your own parallel text: one sentence per line, files aligned.

python -m vit_jax.main --config=configs/transformer_text.py --workdir=runs/mt \
    --config.data.train_files=data/train.en,data/train.de \
    --config.data.eval_files=data/val.en,data/val.de
"""

from vit_jax.train.config import translation_config


def get_config():
  config = translation_config('Transformer-base')
  config.data.dataset = 'files'
  config.data.tokenizer = 'sentencepiece'
  config.data.vocab_size = 8_000
  config.data.max_length = 128
  config.batch_size = 128
  config.total_steps = 50_000
  config.num_eval_decode = 500
  return config
