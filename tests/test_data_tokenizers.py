"""Tests for the tokenizers (vit_jax.data.tokenizers) and the vocabulary a run builds, saves
in its workdir and reuses (vit_jax.data.vocabulary)."""

import pytest

from vit_jax.data import tokenizers, vocabulary

from helpers import build_text, small_dates_config, text_data_config


def test_bytes_round_trip_including_non_ascii():
  tokenizer = tokenizers.ByteTokenizer()
  sample = 'Grüße aus Köln, 東京 🙂 — «ça va»'
  ids = tokenizer.encode(sample)
  assert tokenizer.vocab_size == 258 and min(ids) >= 2 and max(ids) < 258
  assert len(ids) == len(sample.encode('utf-8'))
  assert tokenizer.decode(ids) == sample
  assert tokenizer.decode(ids + [tokenizers.EOS_ID] + ids) == sample  # Stops at EOS.
  assert tokenizer.decode([0] + ids + [0, 0]) == sample  # Skips padding.
  flat, lengths = tokenizer.encode_many([sample, '', 'a'])
  assert lengths.tolist() == [len(ids), 0, 1] and flat.tolist() == ids + [ord('a') + 2]


def test_chars_round_trip_and_unknown_characters():
  tokenizer = tokenizers.CharTokenizer.build(['abc', 'cäb', 'a b'], vocab_size=100)
  assert tokenizer.vocab_size == 3 + 5  # a b c ä and the space.
  assert tokenizer.decode(tokenizer.encode('bä ca')) == 'bä ca'
  assert tokenizer.encode('x') == [tokenizers.UNK_ID]
  flat, lengths = tokenizer.encode_many(['cab', 'xä'])
  assert flat.tolist() == tokenizer.encode('cab') + tokenizer.encode('xä')
  assert lengths.tolist() == [3, 2]
  # A cap keeps the most frequent characters.
  capped = tokenizers.CharTokenizer.build(['aaab', 'aac'], vocab_size=4)
  assert capped.chars == 'a' and capped.encode('ab') == [3, tokenizers.UNK_ID]


def test_chars_vocabulary_is_saved_and_reused(tmp_path):
  config = small_dates_config()
  first = build_text(config, workdir=str(tmp_path))
  path = tmp_path / 'tokenizer_chars.json'
  assert path.exists() and first.tokenizer.vocab_size > 30
  # A later run uses the saved vocabulary, not one built from its own data.
  path.write_bytes(tokenizers.CharTokenizer('0123456789-').to_bytes())
  again = build_text(config, workdir=str(tmp_path))
  assert again.tokenizer.vocab_size == 14
  assert vocabulary.load_tokenizer(config, str(tmp_path)).chars == '0123456789-'


def test_missing_tokenizer_model_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='No chars tokenizer model in WORKDIR.*train first'):
    vocabulary.load_tokenizer(text_data_config(), str(tmp_path))
  with pytest.raises(FileNotFoundError, match='No sentencepiece tokenizer model'):
    vocabulary.load_tokenizer(text_data_config(tokenizer='sentencepiece'), None)
  bytes_config = text_data_config(tokenizer='bytes')
  assert vocabulary.load_tokenizer(bytes_config, str(tmp_path)).vocab_size == 258


def test_sentencepiece_is_trained_deterministically_saved_and_reused(tmp_path):
  pytest.importorskip('sentencepiece')
  config = small_dates_config(tokenizer='sentencepiece', vocab_size=120)
  first = build_text(config, workdir=str(tmp_path / 'a'))
  second = build_text(config, workdir=str(tmp_path / 'b'))
  model = (tmp_path / 'a' / 'tokenizer.model').read_bytes()
  assert model == (tmp_path / 'b' / 'tokenizer.model').read_bytes()  # Same text, same model.
  tokenizer = first.tokenizer
  assert tokenizer.vocab_size == 120 and second.tokenizer.vocab_size == 120
  for sample in ('Samstag, 3. März 1979', 'le 1er août 2001', '1979-03-03'):
    ids = tokenizer.encode(sample)
    assert tokenizers.EOS_ID not in ids and tokenizers.PAD_ID not in ids
    assert tokenizer.decode(ids + [tokenizers.EOS_ID, 7, 8]) == sample
  loaded = vocabulary.load_tokenizer(config, str(tmp_path / 'a'))
  assert loaded.encode('3 mars 1979') == tokenizer.encode('3 mars 1979')
  with pytest.raises(ValueError, match='holds a 120-id sentencepiece vocabulary.*vocab_size=200'):
    build_text(small_dates_config(tokenizer='sentencepiece', vocab_size=200),
               workdir=str(tmp_path / 'a'))
  with pytest.raises(ValueError, match='could not train a 5000-piece vocabulary.*lower') as e:
    build_text(small_dates_config(tokenizer='sentencepiece', vocab_size=5000))
  assert '..' not in str(e.value), e.value  # SentencePiece's message ends in its own '.'.
