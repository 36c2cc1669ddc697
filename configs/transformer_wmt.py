"""Transformer-base on WMT'14 English-German from TFDS, as in the paper.

python -m vit_jax.main --config=configs/transformer_wmt.py --workdir=runs/wmt
Needs the TFDS dataset prepared (network once, or --config.data.tfds_data_dir).
"""

from vit_jax.train.config import translation_config


def get_config():
  config = translation_config('Transformer-base')
  config.data.dataset = 'wmt14_translate/de-en'
  config.data.source_language = 'en'
  config.data.target_language = 'de'
  config.data.train_split = 'train'
  config.data.test_split = 'test'
  config.data.tokenizer = 'sentencepiece'
  config.data.vocab_size = 32_000
  config.data.max_length = 256
  config.batch_size = 256
  config.total_steps = 100_000
  config.num_eval_decode = 1000
  return config
