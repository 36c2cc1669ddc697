"""Tests for the translation input pipeline (vit_jax.data.text) on generated data."""

import datetime
import gzip
import re
import subprocess
import sys

import numpy as np
import pytest

from vit_jax import errors
from vit_jax.data import dates
from vit_jax.data import text, text_config, tokenizers, vocabulary

# Weekday names per language, Monday first, written out here independently of `dates`.
WEEKDAYS = {
    'en': 'monday tuesday wednesday thursday friday saturday sunday',
    'en_short': 'mon tue wed thu fri sat sun',
    'de': 'montag dienstag mittwoch donnerstag freitag samstag sonntag',
    'de_short': 'mo. di. mi. do. fr. sa. so.',
    'fr': 'lundi mardi mercredi jeudi vendredi samedi dimanche',
    'es': 'lunes martes miércoles jueves viernes sábado domingo',
    'it': 'lunedì martedì mercoledì giovedì venerdì sabato domenica',
}
WEEKDAY_NUMBERS = {name: number for names in WEEKDAYS.values()
                   for number, name in enumerate(names.split())}


def _config(**overrides):
  config = text_config.default_config()
  config.update(overrides)
  return config


def _small_dates(**overrides):
  """A quick dates config: 600 train / 50 test examples, chars, no workdir needed."""
  return _config(**{'dates_train_size': 600, 'dates_test_size': 50, **overrides})


def _build(config, workdir=None, process_index=0, process_count=1):
  return text.build(config, workdir=workdir, process_index=process_index,
                    process_count=process_count)


@pytest.fixture(scope='module')
def dates_splits():
  return dates.generate(train_size=dates.NUM_DAYS, test_size=1000, seed=0)


@pytest.fixture(scope='module')
def default_dates():
  return _build(text_config.default_config())


# ------------------------------------------------------------------------------ dates


def test_dates_are_deterministic_and_pinned(dates_splits):
  again = dates.generate(train_size=300, test_size=1000, seed=0)
  assert again['train'] == dates_splits['train'][:300]
  assert again['test'] == dates_splits['test']
  # Pinned, so that reported test accuracies are comparable between machines and versions.
  assert dates_splits['test'][:3] == [('2 agosto 2037', '2037-08-02'),
                                      ('le 5 octobre 2033', '2033-10-05'),
                                      ('Fri, May 13, 1960', '1960-05-13')]
  assert dates.generate(300, 1000, seed=1)['test'] != dates_splits['test']


def test_dates_train_and_test_share_no_date(dates_splits):
  train_dates = {target for _, target in dates_splits['train']}
  test_dates = [target for _, target in dates_splits['test']]
  assert len(set(test_dates)) == 1000  # Distinct test dates.
  assert not train_dates & set(test_dates)
  assert len(train_dates) == dates.NUM_DAYS - 1000  # Train uses every other date once.
  train_sources = {source for source, _ in dates_splits['train']}
  assert not train_sources & {source for source, _ in dates_splits['test']}


def test_dates_targets_are_iso_and_sources_name_their_date(dates_splits):
  examples = dates_splits['train'][:5000]
  seen_weekdays = 0
  for source, target in examples:
    date = datetime.date.fromisoformat(target)
    assert 1900 <= date.year <= 2099
    words = source.lower().replace(',', ' ').split()
    named = [WEEKDAY_NUMBERS[w] for w in words if w in WEEKDAY_NUMBERS]
    if named:
      seen_weekdays += 1
      assert named == [date.weekday()], (source, target)
    if str(date.year) not in source:  # Two-digit years: 69-99 -> 19xx, 00-68 -> 20xx.
      assert 1969 <= date.year <= 2068, (source, target)
      assert re.fullmatch(r'\d+[./]\d+[./]\d\d', source), (source, target)
      assert source.endswith(f'{date.year % 100:02d}')
  assert seen_weekdays > 1000


def test_dates_parse_back_in_c_locale(dates_splits):
  # English formats with full names, parsed by the standard library.
  patterns = {r'\w+day, \d+ \w+ \d{4}': '%A, %d %B %Y', r'\w+ \d+, \d{4}': '%B %d, %Y',
              r'\d\d/\d\d/\d\d': '%m/%d/%y', r'\d\d\.\d\d\.\d{4}': '%d.%m.%Y',
              r'\d{8}': '%Y%m%d'}
  parsed = 0
  for source, target in dates_splits['train'][:3000]:
    for pattern, date_format in patterns.items():
      if re.fullmatch(pattern, source):
        try:
          date = datetime.datetime.strptime(source, date_format).date()
        except ValueError:
          continue  # E.g. 'May 3, 1979' matches r'\w+ \d+' but abbreviations differ.
        assert date.isoformat() == target, source
        parsed += 1
  assert parsed > 300


def test_dates_cover_languages_and_formats(dates_splits):
  sources = ' '.join(source.lower() for source, _ in dates_splits['train'][:5000])
  for words in (('march', 'saturday'), ('märz', 'samstag', 'am'), ('mars', 'samedi', '1er'),
                ('marzo', 'sábado', ' de '), ('settembre', 'sabato'), ('/', '.')):
    assert all(w in sources for w in words), words
  # Several casings of the same words.
  cased = ' '.join(s for s, _ in dates_splits['train'][:5000])
  assert all(word in cased for word in ('March', 'march', 'MARCH', 'Mars', 'MÄRZ'))
  assert len({name for name in dates.FORMATS}) >= 25


def test_dates_test_split_does_not_depend_on_train_size():
  assert (dates.generate(10, 50, seed=3)['test'] == dates.generate(900, 50, seed=3)['test'])


# ------------------------------------------------------------------------------ tokenizers


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
  config = _small_dates()
  first = _build(config, workdir=str(tmp_path))
  path = tmp_path / 'tokenizer_chars.json'
  assert path.exists() and first.tokenizer.vocab_size > 30
  # A later run uses the saved vocabulary, not one built from its own data.
  path.write_bytes(tokenizers.CharTokenizer('0123456789-').to_bytes())
  again = _build(config, workdir=str(tmp_path))
  assert again.tokenizer.vocab_size == 14
  assert vocabulary.load_tokenizer(config, str(tmp_path)).chars == '0123456789-'


def test_missing_tokenizer_model_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='No chars tokenizer model in WORKDIR.*train first'):
    vocabulary.load_tokenizer(_config(), str(tmp_path))
  with pytest.raises(FileNotFoundError, match='No sentencepiece tokenizer model'):
    vocabulary.load_tokenizer(_config(tokenizer='sentencepiece'), None)
  assert vocabulary.load_tokenizer(_config(tokenizer='bytes'), str(tmp_path)).vocab_size == 258


def test_sentencepiece_is_trained_deterministically_saved_and_reused(tmp_path):
  pytest.importorskip('sentencepiece')
  config = _small_dates(tokenizer='sentencepiece', vocab_size=120)
  first = _build(config, workdir=str(tmp_path / 'a'))
  second = _build(config, workdir=str(tmp_path / 'b'))
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
    _build(_small_dates(tokenizer='sentencepiece', vocab_size=200), workdir=str(tmp_path / 'a'))
  with pytest.raises(ValueError, match='could not train a 5000-piece vocabulary.*lower'):
    _build(_small_dates(tokenizer='sentencepiece', vocab_size=5000))


# ------------------------------------------------------------------------------ train stream


@pytest.mark.parametrize('shuffle_buffer', [0, 1, 50])
def test_start_step_resumes_the_exact_stream(shuffle_buffer):
  dataset = _build(_small_dates(shuffle_buffer=shuffle_buffer))
  # 600 examples pack into ~190 rows: 40 steps of 16 rows span more than 3 epochs.
  stream = dataset.train_batches(batch_size=16, seed=7)
  reference = [next(stream) for _ in range(40)]
  for start_step in (1, 11, 12, 25, 39):
    resumed = dataset.train_batches(batch_size=16, seed=7, start_step=start_step)
    for expected in reference[start_step:start_step + 2]:
      got = next(resumed)
      for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=f'{start_step} {key}')
  other_seed = next(dataset.train_batches(batch_size=16, seed=8))
  assert (not np.array_equal(other_seed['inputs'], reference[0]['inputs'])) == (
      shuffle_buffer != 1)


def test_epochs_are_reshuffled_and_cover_every_example():
  dataset = _build(_small_dates(pack=False))
  batches = dataset.train_batches(batch_size=600, seed=0)
  first, second = next(batches), next(batches)  # One epoch each.
  decode = dataset.tokenizer.decode
  first_sources = [decode(row) for row in first['inputs']]
  assert sorted(first_sources) == sorted(decode(row) for row in second['inputs'])
  assert sorted(first_sources) == sorted(s for s, _ in dates.generate(600, 50, 0)['train'])
  assert first_sources != [decode(row) for row in second['inputs']]


# ------------------------------------------------------------------------------ eval


def test_eval_covers_every_test_example_once_with_masks(default_dates):
  batch_size = 64  # 1000 = 15 * 64 + 40: the last batch holds 24 padding rows.
  batches = list(default_dates.eval_batches(batch_size))
  assert len(batches) == default_dates.num_eval_batches(batch_size) == 16
  masks = np.concatenate([b['mask'] for b in batches])
  assert masks.dtype == np.float32 and masks.tolist() == [1.0] * 1000 + [0.0] * 24
  inputs = np.concatenate([b['inputs'] for b in batches])
  targets = np.concatenate([b['targets'] for b in batches])
  assert inputs.shape == targets.shape == (1024, 64) and inputs.dtype == np.int32
  assert set(batches[0]) == {'inputs', 'targets', 'mask'}
  assert not inputs[1000:].any() and not targets[1000:].any()
  decode = default_dates.tokenizer.decode
  decoded = [(decode(s), decode(t)) for s, t in zip(inputs[:1000], targets[:1000])]
  assert decoded == default_dates.eval_texts() == dates.generate(10, 1000, 0)['test']


def test_two_hosts_get_disjoint_covering_shares():
  config = _small_dates(dates_train_size=101, dates_test_size=51, pack=False, shuffle_buffer=1)
  hosts = [_build(config, process_index=i, process_count=2) for i in range(2)]
  splits = dates.generate(101, 51, 0)
  assert [h.local_num_train_examples for h in hosts] == [51, 50]
  assert [h.local_num_test_examples for h in hosts] == [26, 25]
  assert hosts[0].num_eval_batches(5) == hosts[1].num_eval_batches(5) == 6  # 26 / 5, rounded up.
  test_texts, train_sources = [], []
  for host in hosts:
    masks = np.concatenate([b['mask'] for b in host.eval_batches(5)])
    assert masks.sum() == host.local_num_test_examples and len(masks) == 30
    test_texts.extend(host.eval_texts())
    train = next(host.train_batches(batch_size=host.local_num_train_examples))
    train_sources.append({host.tokenizer.decode(row) for row in train['inputs']})
  assert test_texts == splits['test']  # Host 0's share, then host 1's, in order.
  assert not train_sources[0] & train_sources[1]
  assert train_sources[0] | train_sources[1] == {s for s, _ in splits['train']}
  # Both hosts use the same vocabulary (built from the whole train split).
  assert hosts[0].tokenizer.chars == hosts[1].tokenizer.chars


# ------------------------------------------------------------------------------ files


def _write(path, lines, compress=False):
  data = ''.join(line + '\n' for line in lines).encode('utf-8')
  path.write_bytes(gzip.compress(data) if compress else data)
  return str(path)


def _files_config(tmp_path, source_lines, target_lines, compress=False, **overrides):
  suffix = '.gz' if compress else ''
  source = _write(tmp_path / f'train.de{suffix}', source_lines, compress)
  target = _write(tmp_path / f'train.en{suffix}', target_lines, compress)
  test_source = _write(tmp_path / 'test.de', ['Guten Morgen', 'Danke'])
  test_target = _write(tmp_path / 'test.en', ['Good morning', 'Thanks'])
  return _config(dataset='files', train_files=f'{source},{target}',
                 eval_files=f'{test_source},{test_target}', **overrides)


@pytest.mark.parametrize('compress', [False, True])
def test_files_plain_and_gzip(tmp_path, compress):
  german = ['Hallo Welt', 'Wie geht es dir?', 'Grüße aus Köln']
  english = ['Hello world', 'How are you?', 'Greetings from Cologne']
  config = _files_config(tmp_path, german, english, compress=compress, tokenizer='bytes',
                         pack=False, shuffle_buffer=1)
  dataset = _build(config)
  assert dataset.num_train_examples == 3 and dataset.num_test_examples == 2
  batch = next(dataset.train_batches(batch_size=3))
  decode = dataset.tokenizer.decode
  assert [decode(row) for row in batch['inputs']] == german
  assert [decode(row) for row in batch['targets']] == english
  assert dataset.eval_texts() == [('Guten Morgen', 'Good morning'), ('Danke', 'Thanks')]


def test_files_with_different_line_counts_name_both(tmp_path):
  config = _files_config(tmp_path, ['a', 'b', 'c'], ['x', 'y'])
  with pytest.raises(ValueError, match=r"train\.de' has 3 lines and .*train\.en' has 2"):
    _build(config)


def test_files_with_non_utf8_name_the_line(tmp_path):
  config = _files_config(tmp_path, ['eins', 'zwei', 'drei'], ['one', 'two', 'three'])
  (tmp_path / 'train.de').write_bytes(b'eins\nzwei\ndr\xe9i\n')  # Latin-1 'é'.
  with pytest.raises(ValueError, match=r"train\.de' line 3: not valid UTF-8.*iconv"):
    _build(config)


def test_missing_file_and_malformed_pair_are_clear_errors(tmp_path):
  config = _files_config(tmp_path, ['a'], ['b'])
  config.eval_files = f'{tmp_path}/test.de,{tmp_path}/nope.en'
  with pytest.raises(FileNotFoundError, match=r"eval_files: file '.*nope\.en' does not exist"):
    _build(config)
  config.eval_files = f'{tmp_path}/test.de'
  with pytest.raises(ValueError, match="expected 'SOURCE_FILE,TARGET_FILE'"):
    _build(config)
  with pytest.raises(ValueError, match='needs config.data.train_files'):
    _build(_config(dataset='files'))


def test_files_empty_lines_are_skipped_and_counted(tmp_path, capsys):
  config = _files_config(tmp_path, ['a b', '', 'c d', 'e f', '  '], ['A B', 'X', 'C D', '', 'Y'],
                         tokenizer='bytes', pack=False, shuffle_buffer=1)
  dataset = _build(config)
  assert dataset.num_train_examples == 5 and dataset.local_num_train_examples == 2
  assert dataset.num_empty == {'train': 3, 'test': 0}
  # A plain line (absl's 'W1205 04:03:20.99 1399 packing.py:53]' prefix before).
  said = capsys.readouterr().out.splitlines()
  assert (f'Skipped 3 of 5 examples of the train_files ({tmp_path}/train.de, {tmp_path}/train.en) '
          'whose source or target is empty (lines 2, 4, 5).') in said
  batch = next(dataset.train_batches(batch_size=2))
  assert [dataset.tokenizer.decode(r) for r in batch['targets']] == ['A B', 'C D']


def test_a_test_split_with_nothing_to_evaluate_stops_the_build(tmp_path):
  """Every run evaluates at its end: an unusable test split is refused before training."""
  config = _files_config(tmp_path, ['a b', 'c d'], ['A B', 'C D'], tokenizer='bytes')
  _write(tmp_path / 'test.en', ['', '  '])
  with pytest.raises(errors.ConfigError, match=r'The test split eval_files \(.*test\.de, .*test'
                     r'\.en\) has no examples in use: each of its 2 has an empty side; give test '
                     r'pairs with both sides\.'):
    _build(config)
  _write(tmp_path / 'test.de', [])
  _write(tmp_path / 'test.en', [])
  with pytest.raises(errors.ConfigError, match=r'has no examples in use: it is empty;'):
    _build(config)


@pytest.mark.parametrize('long_examples', ['truncate', 'skip'])
def test_files_long_lines_are_truncated_or_skipped_and_counted(tmp_path, capsys, long_examples):
  sources = ['short', 'x' * 30, 'also short']
  targets = ['kurz', 'y' * 5, 'z' * 12]  # The third is too long on the target side.
  config = _files_config(tmp_path, sources, targets, tokenizer='bytes', max_length=10,
                         long_examples=long_examples, pack=False, shuffle_buffer=1)
  dataset = _build(config)
  assert dataset.num_long['train'] == 2
  # Test pairs are all evaluated: 'Guten Morgen' (12 bytes) is truncated, never skipped.
  assert dataset.local_num_test_examples == 2 and dataset.num_long['test'] == 1
  action = 'Truncated' if long_examples == 'truncate' else 'Skipped'
  said = capsys.readouterr().out.splitlines()
  assert (f'{action} 2 of 3 examples of the train_files ({tmp_path}/train.de, {tmp_path}/train.en) '
          'that are longer than 10 tokens (source or target, EOS included; the longest has 31; '
          "lines 2, 3). config.data.long_examples ('truncate' or 'skip') chooses what happens to "
          'them; or raise config.data.max_length.') in said
  # The test split's are truncated whatever long_examples says (it told to set it).
  assert (f'Truncated 1 of 2 examples of the eval_files ({tmp_path}/test.de, {tmp_path}/test.en) '
          'that are longer than 10 tokens (source or target, EOS included; the longest has 13; '
          'line 1). Test pairs are evaluated truncated; raise config.data.eval_max_length to '
          'evaluate them whole.') in said
  decode = dataset.tokenizer.decode
  batch = next(dataset.train_batches(batch_size=dataset.local_num_train_examples))
  if long_examples == 'truncate':
    assert [decode(r) for r in batch['inputs']] == ['short', 'x' * 9, 'also short'[:9]]
    assert [decode(r) for r in batch['targets']] == ['kurz', 'y' * 5, 'z' * 9]
    assert (batch['inputs'][:, -1] == [0, tokenizers.EOS_ID, tokenizers.EOS_ID]).all()
  else:
    assert [decode(r) for r in batch['inputs']] == ['short']
    assert dataset.local_num_train_examples == 1


# ------------------------------------------------------------------------------ TFDS


def test_tfds_translation_through_build_with_mock_data():
  tfds = pytest.importorskip('tensorflow_datasets')
  with tfds.testing.mock_data(num_examples=9):
    dataset = _build(_config(dataset='wmt14_translate/de-en', max_length=32, eval_max_length=48))
    assert dataset.num_train_examples == 9 and dataset.num_test_examples == 9
    batches = list(dataset.eval_batches(4))
    assert len(batches) == 3 and batches[0]['inputs'].shape == (4, 48)
    assert np.concatenate([b['mask'] for b in batches]).sum() == 9
    german_first = dataset.eval_texts()
    batch = next(dataset.train_batches(batch_size=4, seed=0))
    assert batch['inputs'].shape == (4, 32) and batch['inputs_segmentation'].max() >= 1
    # source_language / target_language choose the direction.
    swapped = _build(_config(dataset='wmt14_translate/de-en', source_language='en',
                             target_language='de'))
    assert swapped.eval_texts() == [(t, s) for s, t in german_first]
    with pytest.raises(ValueError, match=r"source_language='fr' .* languages are \['de', 'en'\]"):
      _build(_config(dataset='wmt14_translate/de-en', source_language='fr'))


def test_tfds_two_hosts_share_a_prepared_dataset(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top

  def split(name, size):  # Any sentences hold all characters: a small vocabulary sample will do.
    return tf.data.Dataset.from_tensor_slices({'de': [f'{name} Satz {i}' for i in range(size)],
                                               'en': [f'{name} sentence {i} (0123456789)'
                                                      for i in range(size)]})

  tfds.dataset_builders.store_as_tfds_dataset(
      name='tiny_translate', version='1.0.0', data_dir=str(tmp_path),
      features=tfds.features.Translation(languages=['de', 'en']),
      split_datasets={'train': split('train', 10), 'test': split('test', 7)})
  config = _config(dataset='tiny_translate', tfds_data_dir=str(tmp_path), vocabulary_sample=4,
                   pack=False)
  hosts = [_build(config, workdir=str(tmp_path / 'run'), process_index=i, process_count=2)
           for i in range(2)]
  assert [h.local_num_train_examples for h in hosts] == [5, 5]
  assert [h.local_num_test_examples for h in hosts] == [4, 3]
  assert hosts[0].num_eval_batches(3) == hosts[1].num_eval_batches(3) == 2
  test_texts = hosts[0].eval_texts() + hosts[1].eval_texts()
  assert sorted(test_texts) == sorted((f'test Satz {i}', f'test sentence {i} (0123456789)')
                                      for i in range(7))
  train_sources = [{h.tokenizer.decode(row) for row in next(h.train_batches(5))['inputs']}
                   for h in hosts]
  assert not train_sources[0] & train_sources[1]
  assert train_sources[0] | train_sources[1] == {f'train Satz {i}' for i in range(10)}
  assert hosts[0].tokenizer.chars == hosts[1].tokenizer.chars


def test_unprepared_tfds_dataset_is_a_clear_error(tmp_path):
  config = _config(dataset='wmt14_translate/de-en', tfds_data_dir=str(tmp_path),
                   tfds_download=False)
  with pytest.raises(RuntimeError) as error:
    _build(config)
  message = str(error.value)
  assert "'wmt14_translate/de-en' is not prepared" in message and str(tmp_path) in message


def test_unknown_dataset_name_suggests_close_names():
  with pytest.raises(ValueError, match="Unknown dataset 'wmt14_translat'.*wmt14_translate"):
    _build(_config(dataset='wmt14_translat'))


# ------------------------------------------------------------------------------ config


def test_config_mistakes_are_named():
  with pytest.raises(ValueError, match="Unknown text data config keys.*'max_len'"):
    _build({'max_len': 8})
  with pytest.raises(ValueError, match="tokenizer='words'"):
    _build(_config(tokenizer='words'))
  with pytest.raises(ValueError, match="long_examples='drop'"):
    _build(_config(long_examples='drop'))
  with pytest.raises(ValueError, match="only has splits 'train'"):
    _build(_config(test_split='validation'))
  with pytest.raises(ValueError, match=r'process_index=2 must be in \[0, process_count=2\)'):
    _build(_config(), process_index=2, process_count=2)


def test_dates_and_files_run_without_tensorflow(tmp_path):
  """TensorFlow (about 0.6 GB resident) loads for TFDS datasets only."""
  _write(tmp_path / 'a.src', ['one', 'two'])
  _write(tmp_path / 'a.tgt', ['eins', 'zwei'])
  files = f'{tmp_path}/a.src,{tmp_path}/a.tgt'
  code = ('import sys\n'
          'from vit_jax.data import text, text_config\n'
          "text.build({'dates_train_size': 50, 'dates_test_size': 5}, process_index=0, "
          'process_count=1)\n'
          f"text.build({{'dataset': 'files', 'train_files': {files!r}, 'eval_files': {files!r}, "
          "'tokenizer': 'bytes'}, process_index=0, process_count=1)\n"
          'assert "tensorflow" not in sys.modules, "tensorflow was imported"\n')
  subprocess.run([sys.executable, '-c', code], check=True)
