"""Tokenizers for the text pipeline: UTF-8 bytes, characters, and SentencePiece.

Every tokenizer reserves id 0 for padding (PAD_ID) and id 1 for end-of-sequence (EOS_ID).
`encode` returns ids without EOS; `decode` stops at the first EOS and skips padding.
'chars' and 'sentencepiece' vocabularies are built from training text and saved in the workdir
(`vocabulary_path`), so that later runs and translation use the same ids.
"""

import io
import json
import os
from typing import Iterable, Sequence

import numpy as np

from vit_jax import errors, files

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2  # 'chars' and 'sentencepiece': text the vocabulary does not cover.
TOKENIZERS = ('chars', 'bytes', 'sentencepiece')
# File in the workdir that holds a trained vocabulary; 'bytes' needs none.
VOCABULARY_FILES = {'chars': 'tokenizer_chars.json', 'sentencepiece': 'tokenizer.model'}
# SentencePiece's result depends on its thread count (not on the machine's cores), so it is fixed:
# every host, and every rerun, trains the same vocabulary from the same text.
_SENTENCEPIECE_THREADS = 16
_REPLACEMENT = '\N{REPLACEMENT CHARACTER}'  # How 'chars' decodes UNK_ID.


def _cut_at_eos(ids: Iterable[int]) -> list[int]:
  """The ids before the first EOS, without padding."""
  kept = []
  for i in ids:
    i = int(i)
    if i == EOS_ID:
      break
    if i != PAD_ID:
      kept.append(i)
  return kept


def _ragged(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Lists of ids -> (all ids concatenated, int32 (total,); lengths, int64 (len(lists),))."""
  lengths = np.fromiter((len(ids) for ids in lists), np.int64, count=len(lists))
  flat = np.fromiter((i for ids in lists for i in ids), np.int32, count=int(lengths.sum()))
  return flat, lengths


class ByteTokenizer:
  """UTF-8 bytes shifted by 2 (ids 2..257); needs no vocabulary file."""
  kind = 'bytes'
  offset = 2  # PAD_ID and EOS_ID come first.
  vocab_size = 256 + offset

  def encode(self, text: str) -> list[int]:
    return [b + self.offset for b in text.encode('utf-8')]

  def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts concatenated, int32; tokens per text, int64)."""
    encoded = [t.encode('utf-8') for t in texts]
    lengths = np.fromiter((len(b) for b in encoded), np.int64, count=len(encoded))
    flat = np.frombuffer(b''.join(encoded), np.uint8).astype(np.int32) + self.offset
    return flat, lengths

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(i - self.offset for i in _cut_at_eos(ids) if self.offset <= i < self.vocab_size)
    return data.decode('utf-8', errors='replace')

  def __repr__(self):
    return 'ByteTokenizer(vocab_size=258)'


class CharTokenizer:
  """One id per character of a fixed character list (ids 3..); other characters map to UNK_ID."""
  kind = 'chars'
  offset = 3  # PAD_ID, EOS_ID and UNK_ID come first.

  def __init__(self, chars: str):
    if len(set(chars)) != len(chars):
      raise ValueError(f'CharTokenizer characters must be distinct, got {chars!r}.')
    self.chars = chars
    self.vocab_size = len(chars) + self.offset
    self._ids = {c: i + self.offset for i, c in enumerate(chars)}
    # Sorted code points and their ids, for vectorised encoding.
    codes = np.array([ord(c) for c in chars], np.int64)
    order = np.argsort(codes)
    self._sorted_codes = codes[order]
    self._sorted_ids = (order + self.offset).astype(np.int32)

  @classmethod
  def build(cls, texts: Sequence[str], vocab_size: int) -> 'CharTokenizer':
    """The characters of `texts`, the most frequent ones when there are over vocab_size - 3."""
    codes = np.frombuffer(''.join(texts).encode('utf-32-le'), np.uint32)
    unique, counts = np.unique(codes, return_counts=True)
    keep = np.lexsort((unique, -counts))[:max(vocab_size - cls.offset, 0)]  # Frequent first.
    return cls(''.join(chr(c) for c in np.sort(unique[keep])))

  def encode(self, text: str) -> list[int]:
    return [self._ids.get(c, UNK_ID) for c in text]

  def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts concatenated, int32; tokens per text, int64)."""
    lengths = np.fromiter((len(t) for t in texts), np.int64, count=len(texts))
    codes = np.frombuffer(''.join(texts).encode('utf-32-le'), np.uint32).astype(np.int64)
    if not len(self._sorted_codes):
      return np.full(len(codes), UNK_ID, np.int32), lengths
    where = np.minimum(np.searchsorted(self._sorted_codes, codes), len(self._sorted_codes) - 1)
    known = self._sorted_codes[where] == codes
    return np.where(known, self._sorted_ids[where], UNK_ID).astype(np.int32), lengths

  def decode(self, ids: Iterable[int]) -> str:
    chars, offset = self.chars, self.offset
    return ''.join(chars[i - offset] if offset <= i < self.vocab_size else _REPLACEMENT
                   for i in _cut_at_eos(ids))

  def to_bytes(self) -> bytes:
    return json.dumps({'kind': self.kind, 'chars': self.chars}, ensure_ascii=False).encode('utf-8')

  @classmethod
  def from_bytes(cls, data: bytes, path: str = '<bytes>') -> 'CharTokenizer':
    try:
      saved = json.loads(data.decode('utf-8'))
      return cls(saved['chars'])
    except (ValueError, KeyError, TypeError) as e:
      raise errors.BadFileError(f'{path} is not a saved character vocabulary ({e}); delete it to '
                                'build a new one from the training text.') from e

  def __repr__(self):
    return f'CharTokenizer(vocab_size={self.vocab_size})'


class SentencePieceTokenizer:
  """A SentencePiece model with pad 0, EOS 1 and unknown 2 (and no BOS)."""
  kind = 'sentencepiece'

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.model_proto = model_proto
    self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
    if (self._processor.pad_id(), self._processor.eos_id()) != (PAD_ID, EOS_ID):
      raise errors.BadFileError(f'This SentencePiece model has pad id {self._processor.pad_id()} '
                                f'and EOS id {self._processor.eos_id()}; the pipeline needs '
                                f'{PAD_ID} and {EOS_ID}. Train it with pad_id=0 eos_id=1 (as '
                                '`train` does).')
    self.vocab_size = self._processor.get_piece_size()

  @classmethod
  def train(cls, texts: Sequence[str], vocab_size: int) -> 'SentencePieceTokenizer':
    """A unigram model of `vocab_size` pieces trained on `texts`; the same texts, the same model."""
    try:
      import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise errors.MissingPackageError("config.data.tokenizer='sentencepiece' needs the "
                                       "sentencepiece package (pip install sentencepiece), or use "
                                       "tokenizer='chars' or 'bytes'.") from e
    model = io.BytesIO()
    spm.set_random_generator_seed(0)
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
          model_type='unigram', character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
          unk_id=UNK_ID, bos_id=-1, input_sentence_size=0, shuffle_input_sentence=False,
          num_threads=_SENTENCEPIECE_THREADS, minloglevel=2)
    except RuntimeError as e:
      raise errors.ConfigError(f'SentencePiece could not train a {vocab_size}-piece vocabulary on '
                               f'{len(texts)} training sentences: {str(e).rstrip(". ")}. Set '
                               'config.data.vocab_size lower (or use more training text).') from e
    return cls(model.getvalue())

  def encode(self, text: str) -> list[int]:
    return self._processor.encode(text)

  def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts concatenated, int32; tokens per text, int64)."""
    return _ragged(self._processor.encode(list(texts), num_threads=os.cpu_count() or 1))

  def decode(self, ids: Iterable[int]) -> str:
    return self._processor.decode([i for i in _cut_at_eos(ids) if i < self.vocab_size])

  def to_bytes(self) -> bytes:
    return self.model_proto

  @classmethod
  def from_bytes(cls, data: bytes, path: str = '<bytes>') -> 'SentencePieceTokenizer':
    try:
      return cls(data)
    except ImportError as e:
      raise errors.MissingPackageError(f'{path} is a SentencePiece model: pip install '
                                       'sentencepiece to use it.') from e
    except RuntimeError as e:
      raise errors.BadFileError(f'{path} is not a SentencePiece model ({e}); delete it to train a '
                                'new one from the training text.') from e

  def __repr__(self):
    return f'SentencePieceTokenizer(vocab_size={self.vocab_size})'


Tokenizer = ByteTokenizer | CharTokenizer | SentencePieceTokenizer
_CLASSES = {'chars': CharTokenizer, 'sentencepiece': SentencePieceTokenizer}


# ------------------------------------------------------------------------------ Files


def vocabulary_path(kind: str, workdir: str) -> str | None:
  """Where a trained vocabulary of this kind lives in workdir; None for 'bytes'."""
  name = VOCABULARY_FILES.get(kind)
  return None if name is None else os.path.join(workdir, name)


def load(kind: str, path: str) -> Tokenizer:
  """The saved vocabulary at `path` ('chars' or 'sentencepiece')."""
  return _CLASSES[kind].from_bytes(files.read_bytes(path), path)


def train(kind: str, texts: Sequence[str], vocab_size: int) -> Tokenizer:
  """A new vocabulary of this kind for `texts` ('bytes' ignores them)."""
  if kind == 'bytes':
    return ByteTokenizer()
  if kind == 'chars':
    return CharTokenizer.build(texts, vocab_size)
  return SentencePieceTokenizer.train(texts, vocab_size)
