"""A run's tokenizer: built from the train split and saved in the workdir, or loaded from there.

  tokenizer = vocabulary.load_tokenizer(config.data, workdir)  # The one training saved.

'chars' and 'sentencepiece' vocabularies live in the workdir (`tokenizers.VOCABULARY_FILES`);
'bytes' needs none. A saved vocabulary must match config.vocab_size.
"""

from absl import logging
import ml_collections

from vit_jax import errors, files, progress
from vit_jax.data import text_config, tokenizers


def _checked_vocabulary(tokenizer, config: ml_collections.ConfigDict, path: str):
  """Raises when a saved vocabulary does not match config.vocab_size."""
  if tokenizer.kind == 'sentencepiece':
    ok, wanted = tokenizer.vocab_size == config.vocab_size, 'exactly'
  else:
    ok, wanted = tokenizer.vocab_size <= config.vocab_size, 'at most'
  if not ok:
    raise errors.ConfigError(
        f'{path} holds a {tokenizer.vocab_size}-id {tokenizer.kind} vocabulary, but '
        f'config.data.vocab_size={config.vocab_size} asks for {wanted} that many: set '
        f'vocab_size={tokenizer.vocab_size}, or delete the file (or use a new workdir) to build '
        'a new vocabulary.')


def load_tokenizer(config, workdir: str | None) -> tokenizers.Tokenizer:
  """The tokenizer a run with this data config trained and saved in `workdir`.

  Args:
    config: the data ConfigDict (or dict) of the run; only `tokenizer` and `vocab_size` matter.
    workdir: the run's directory; unused for the 'bytes' tokenizer.

  Raises:
    FileNotFoundError: 'chars' or 'sentencepiece' and no saved vocabulary in workdir.
    ValueError: the saved vocabulary does not match config.vocab_size.
  """
  config = text_config.checked_config(ml_collections.ConfigDict(config))
  if config.tokenizer == 'bytes':
    return tokenizers.ByteTokenizer()
  path = tokenizers.vocabulary_path(config.tokenizer, workdir) if workdir else None
  if path is None or not files.exists(path):
    raise errors.MissingFileError(
        f'No {config.tokenizer} tokenizer model in WORKDIR={workdir!r} (expected '
        f'{tokenizers.VOCABULARY_FILES[config.tokenizer]} there): train first (training builds '
        'the vocabulary and saves it in the workdir), or pass the training run\'s workdir.')
  tokenizer = tokenizers.load(config.tokenizer, path)
  _checked_vocabulary(tokenizer, config, path)
  return tokenizer


def build_tokenizer(config: ml_collections.ConfigDict, workdir: str | None,
                    source) -> tokenizers.Tokenizer:
  """The vocabulary saved in workdir, or a new one from the train split (saved when possible)."""
  if config.tokenizer == 'bytes':
    return tokenizers.ByteTokenizer()
  path = tokenizers.vocabulary_path(config.tokenizer, workdir) if workdir else None
  if path and files.exists(path):
    tokenizer = tokenizers.load(config.tokenizer, path)
    _checked_vocabulary(tokenizer, config, path)
    progress.log(f'Reusing the {tokenizer.vocab_size:,}-id {config.tokenizer} vocabulary '
                 f'that {path} holds (a new corpus needs a new --workdir).')
    return tokenizer
  # Every host builds it from the same sample of the whole train split, so all get the same ids;
  # each writes the (identical) file, which also serves hosts without a shared workdir.
  texts = source.vocabulary_texts(config.vocabulary_sample)
  with progress.phase(f'Building a {config.tokenizer} vocabulary (at most '
                      f'{config.vocab_size:,} ids) from {len(texts):,} sentences') as phase:
    tokenizer = tokenizers.train(config.tokenizer, texts, config.vocab_size)
    phase.result = f'{tokenizer.vocab_size:,} ids'
  if path:
    files.write_bytes_atomically(path, tokenizer.to_bytes())
    logging.info('Built a %d-id %s vocabulary from %d sentences; saved it in %s',
                 tokenizer.vocab_size, config.tokenizer, len(texts), path)
  else:
    logging.warning('Built a %d-id %s vocabulary from %d sentences, but there is no workdir to '
                    'save it in: translating later needs the same vocabulary.',
                    tokenizer.vocab_size, config.tokenizer, len(texts))
  return tokenizer
