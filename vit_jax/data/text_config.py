"""The translation data config: every knob with its default (`default_config`), and its checks.

  config = text_config.checked_config(overrides)  # Defaults updated; mistakes raise ConfigError.
"""

import ml_collections
from ml_collections import config_dict

from vit_jax.data import checks, tokenizers

LONG_EXAMPLES = ('truncate', 'skip')


def default_config() -> ml_collections.ConfigDict:
  """Every text data knob with its default; defaults suit the embedded 'dates' task."""
  config = ml_collections.ConfigDict()
  # 'dates' (embedded, generated: written dates in 5 languages -> 'YYYY-MM-DD'), 'files'
  # (train_files / eval_files), or a TFDS translation dataset ('wmt14_translate/de-en', ...).
  config.dataset = 'dates'
  # 'files': 'SRC,TGT', aligned sentence-per-line UTF-8 files (or .gz).
  config.train_files = config_dict.placeholder(str)
  config.eval_files = config_dict.placeholder(str)  # 'files': 'SRC,TGT' of the test set, likewise.
  # TFDS: source feature ('en'); None: the dataset's first language.
  config.source_language = config_dict.placeholder(str)
  # TFDS: target feature ('de'); None: the dataset's second one.
  config.target_language = config_dict.placeholder(str)
  config.train_split = 'train'  # TFDS split ('train', 'train[:10%]'); dates: 'train' or 'test'.
  config.test_split = 'test'  # TFDS: 'test' (wmt14: newstest2014), 'validation'; dates: 'test'.
  # TFDS data_dir; None: TFDS's default ($TFDS_DATA_DIR or ~/...).
  config.tfds_data_dir = config_dict.placeholder(str)
  # Manually downloaded archives; None: TFDS's default.
  config.tfds_manual_dir = config_dict.placeholder(str)
  config.tfds_download = True  # Run download_and_prepare when not prepared (WMT: GBs, hours).
  # Retries of each download, with exponential backoff (so offline, many take minutes to fail).
  config.tfds_download_retries = 10
  # 'chars' (the training text's characters), 'bytes' (UTF-8 bytes, 258 ids, no file) or
  # 'sentencepiece' (unigram model trained on the training text). 'chars' and 'sentencepiece'
  # are saved in the workdir (tokenizer_chars.json, tokenizer.model) and reused from there.
  config.tokenizer = 'chars'
  config.vocab_size = 8000  # sentencepiece: exact vocabulary size; chars: the most it may have.
  config.vocabulary_sample = 100_000  # Train pairs (spread over the split) to build it on.
  config.max_length = 64  # Train tokens per row and side, EOS included.
  # Eval tokens per row and side, EOS included; None: max_length.
  config.eval_max_length = config_dict.placeholder(int)
  # Longer train examples: 'truncate' (keep the start) or 'skip'; test ones are truncated.
  config.long_examples = 'truncate'
  config.pack = True  # Pack several train examples per row (adds segmentation and positions).
  config.shuffle_buffer = 0  # 0: reshuffle everything each epoch; 1: keep the order; N: tf-style.
  config.dates_train_size = 40_000  # dates: train examples (each a different date).
  config.dates_test_size = 1_000  # dates: test examples (dates that are never in train).
  config.dates_seed = 0  # dates: fixes both splits (which dates, formats and casings).
  return config


def checked_config(config) -> ml_collections.ConfigDict:
  """The defaults updated with `config`; unknown keys and out-of-range values raise ConfigError."""
  check = checks.Checks(default_config(), config, 'text data config')
  c = check.config
  check.require(isinstance(c.dataset, str) and c.dataset, 'dataset',
                "'dates', 'files' or a TFDS name")
  check.require(c.tokenizer in tokenizers.TOKENIZERS, 'tokenizer',
                f'one of {tokenizers.TOKENIZERS}')
  check.require_int('vocab_size', 4, 'an int > 3')
  check.require_int('vocabulary_sample', 1)
  check.require_int('max_length', 2, 'an int >= 2 (a token and EOS)')
  check.require(c.eval_max_length is None
                or (checks.is_int(c.eval_max_length) and c.eval_max_length >= 2),
                'eval_max_length', 'None or an int >= 2')
  check.require_int('tfds_download_retries', 0)
  check.require(c.long_examples in LONG_EXAMPLES, 'long_examples', f'one of {LONG_EXAMPLES}')
  check.require(isinstance(c.pack, bool), 'pack', 'True or False')
  check.require_int('shuffle_buffer', 0)
  check.require_int('dates_train_size', 1)
  check.require_int('dates_test_size', 1)
  check.require_int('dates_seed', 0)
  return check.result()
