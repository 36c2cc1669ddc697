"""Tests for where sentence pairs come from (vit_jax.data.text_sources): parallel text files
and TFDS translation datasets, through `text.build`."""

import numpy as np
import pytest

from vit_jax import errors
from vit_jax.data import tokenizers

from helpers import build_text, text_data_config, write_lines


def _files_config(tmp_path, source_lines, target_lines, compress=False, **overrides):
  suffix = '.gz' if compress else ''
  source = write_lines(tmp_path / f'train.de{suffix}', source_lines, compress)
  target = write_lines(tmp_path / f'train.en{suffix}', target_lines, compress)
  test_source = write_lines(tmp_path / 'test.de', ['Guten Morgen', 'Danke'])
  test_target = write_lines(tmp_path / 'test.en', ['Good morning', 'Thanks'])
  return text_data_config(dataset='files', train_files=f'{source},{target}',
                          eval_files=f'{test_source},{test_target}', **overrides)


@pytest.mark.parametrize('compress', [False, True])
def test_files_plain_and_gzip(tmp_path, compress):
  german = ['Hallo Welt', 'Wie geht es dir?', 'Grüße aus Köln']
  english = ['Hello world', 'How are you?', 'Greetings from Cologne']
  config = _files_config(tmp_path, german, english, compress=compress, tokenizer='bytes',
                         pack=False, shuffle_buffer=1)
  dataset = build_text(config)
  assert dataset.num_train_examples == 3 and dataset.num_test_examples == 2
  batch = next(dataset.train_batches(batch_size=3))
  decode = dataset.tokenizer.decode
  assert [decode(row) for row in batch['inputs']] == german
  assert [decode(row) for row in batch['targets']] == english
  assert dataset.eval_texts() == [('Guten Morgen', 'Good morning'), ('Danke', 'Thanks')]


def test_files_with_different_line_counts_name_both(tmp_path):
  config = _files_config(tmp_path, ['a', 'b', 'c'], ['x', 'y'])
  with pytest.raises(ValueError, match=r"train\.de' has 3 lines and .*train\.en' has 2"):
    build_text(config)


def test_files_with_non_utf8_name_the_line(tmp_path):
  config = _files_config(tmp_path, ['eins', 'zwei', 'drei'], ['one', 'two', 'three'])
  (tmp_path / 'train.de').write_bytes(b'eins\nzwei\ndr\xe9i\n')  # Latin-1 'é'.
  with pytest.raises(ValueError, match=r"train\.de' line 3: not valid UTF-8.*iconv"):
    build_text(config)


def test_missing_file_and_malformed_pair_are_clear_errors(tmp_path):
  config = _files_config(tmp_path, ['a'], ['b'])
  config.eval_files = f'{tmp_path}/test.de,{tmp_path}/nope.en'
  with pytest.raises(FileNotFoundError, match=r"eval_files: file '.*nope\.en' does not exist"):
    build_text(config)
  config.eval_files = f'{tmp_path}/test.de'
  with pytest.raises(ValueError, match="expected 'SOURCE_FILE,TARGET_FILE'"):
    build_text(config)
  with pytest.raises(ValueError, match='needs config.data.train_files'):
    build_text(text_data_config(dataset='files'))


def test_files_empty_lines_are_skipped_and_counted(tmp_path, capsys):
  config = _files_config(tmp_path, ['a b', '', 'c d', 'e f', '  '], ['A B', 'X', 'C D', '', 'Y'],
                         tokenizer='bytes', pack=False, shuffle_buffer=1)
  dataset = build_text(config)
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
  write_lines(tmp_path / 'test.en', ['', '  '])
  with pytest.raises(errors.ConfigError, match=r'The test split eval_files \(.*test\.de, .*test'
                     r'\.en\) has no examples in use: each of its 2 has an empty side; give test '
                     r'pairs with both sides\.'):
    build_text(config)
  write_lines(tmp_path / 'test.de', [])
  write_lines(tmp_path / 'test.en', [])
  with pytest.raises(errors.ConfigError, match=r'has no examples in use: it is empty;'):
    build_text(config)


@pytest.mark.parametrize('long_examples', ['truncate', 'skip'])
def test_files_long_lines_are_truncated_or_skipped_and_counted(tmp_path, capsys, long_examples):
  sources = ['short', 'x' * 30, 'also short']
  targets = ['kurz', 'y' * 5, 'z' * 12]  # The third is too long on the target side.
  config = _files_config(tmp_path, sources, targets, tokenizer='bytes', max_length=10,
                         long_examples=long_examples, pack=False, shuffle_buffer=1)
  dataset = build_text(config)
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
    dataset = build_text(text_data_config(dataset='wmt14_translate/de-en', max_length=32,
                                          eval_max_length=48))
    assert dataset.num_train_examples == 9 and dataset.num_test_examples == 9
    batches = list(dataset.eval_batches(4))
    assert len(batches) == 3 and batches[0]['inputs'].shape == (4, 48)
    assert np.concatenate([b['mask'] for b in batches]).sum() == 9
    german_first = dataset.eval_texts()
    batch = next(dataset.train_batches(batch_size=4, seed=0))
    assert batch['inputs'].shape == (4, 32) and batch['inputs_segmentation'].max() >= 1
    # source_language / target_language choose the direction.
    swapped = build_text(text_data_config(dataset='wmt14_translate/de-en', source_language='en',
                                          target_language='de'))
    assert swapped.eval_texts() == [(t, s) for s, t in german_first]
    with pytest.raises(ValueError, match=r"source_language='fr' .* languages are \['de', 'en'\]"):
      build_text(text_data_config(dataset='wmt14_translate/de-en', source_language='fr'))


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
  config = text_data_config(dataset='tiny_translate', tfds_data_dir=str(tmp_path),
                            vocabulary_sample=4, pack=False)
  hosts = [build_text(config, workdir=str(tmp_path / 'run'), process_index=i, process_count=2)
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
  config = text_data_config(dataset='wmt14_translate/de-en', tfds_data_dir=str(tmp_path),
                            tfds_download=False)
  with pytest.raises(RuntimeError) as error:
    build_text(config)
  message = str(error.value)
  assert "'wmt14_translate/de-en' is not prepared" in message and str(tmp_path) in message


def test_unknown_dataset_name_suggests_close_names():
  with pytest.raises(ValueError, match="Unknown dataset 'wmt14_translat'.*wmt14_translate"):
    build_text(text_data_config(dataset='wmt14_translat'))
