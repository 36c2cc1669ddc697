"""Tests for packing translation examples into rows and batches (vit_jax.data.packing)."""

import numpy as np
import pytest

from vit_jax.data import dates, packing, text, text_config, tokenizers


def _small_dates(**overrides):
  """A quick dates config: 600 train / 50 test examples, chars."""
  config = text_config.default_config()
  config.update({'dates_train_size': 600, 'dates_test_size': 50, **overrides})
  return config


def _build(config):
  return text.build(config, process_index=0, process_count=1)


def _segments(batch, side, row):
  """The token lists of the packed examples of one row: [ids of segment 1, segment 2, ...]."""
  tokens, segmentation = batch[side][row], batch[side + '_segmentation'][row]
  return [tokens[segmentation == s].tolist() for s in range(1, segmentation.max() + 1)]



@pytest.fixture(scope='module')
def default_dates():
  return _build(text_config.default_config())


def test_pack_starts_a_row_when_either_side_would_overflow():
  # Rows of 6: examples 0 and 1 share a row; 2 would overflow its targets, 3 its sources.
  bounds = packing.pack(np.array([1, 1, 1, 6]), np.array([3, 3, 3, 1]), max_length=6)
  assert bounds.tolist() == [0, 2, 3, 4]
  assert packing.pack(np.zeros(0, np.int64), np.zeros(0, np.int64), 6).tolist() == [0]


def test_buffer_shuffled_is_a_permutation_that_looks_only_buffer_size_ahead():
  order = packing.buffer_shuffled(100, 10, np.random.default_rng(0))
  assert sorted(order.tolist()) == list(range(100)) and order.tolist() != list(range(100))
  assert (order <= np.arange(100) + 9).all()  # The buffer holds the next 10 not yet drawn.
  assert packing.buffer_shuffled(20, 1, np.random.default_rng(0)).tolist() == list(range(20))


def test_packed_rows_hold_whole_consistent_examples(default_dates):
  tokenizer = default_dates.tokenizer
  pairs = set(dates.generate(40_000, 1000, 0)['train'])
  batch = next(default_dates.train_batches(batch_size=32, seed=0))
  assert set(batch) == {'inputs', 'targets', 'inputs_segmentation', 'targets_segmentation',
                        'inputs_position', 'targets_position'}
  for key, array in batch.items():
    assert array.shape == (32, 64) and array.dtype == np.int32, key
  num_examples = 0
  for row in range(32):
    for side in ('inputs', 'targets'):
      segmentation = batch[side + '_segmentation'][row]
      position = batch[side + '_position'][row]
      used = segmentation > 0
      assert (batch[side][row][~used] == 0).all() and (position[~used] == 0).all()
      assert used[:used.sum()].all()  # Examples first, padding after.
      assert (np.diff(segmentation[used]) >= 0).all()  # Segments 1, 1, ..., 2, 2, ...
      for s in range(1, segmentation.max() + 1):
        assert position[segmentation == s].tolist() == list(range((segmentation == s).sum()))
    sources, targets = _segments(batch, 'inputs', row), _segments(batch, 'targets', row)
    assert len(sources) == len(targets) >= 2
    for source_ids, target_ids in zip(sources, targets):
      # Each segment is one whole example ending with its (only) EOS; pairs stay together.
      assert source_ids[-1] == target_ids[-1] == tokenizers.EOS_ID
      assert tokenizers.EOS_ID not in source_ids[:-1] + target_ids[:-1]
      assert (tokenizer.decode(source_ids), tokenizer.decode(target_ids)) in pairs
      num_examples += 1
  assert num_examples > 32 * 2.5


def test_packing_is_greedy_in_order_with_no_shuffling():
  dataset = _build(_small_dates(shuffle_buffer=1, max_length=40))
  train = dates.generate(600, 50, 0)['train']
  tokenizer = dataset.tokenizer
  batch = next(dataset.train_batches(batch_size=8, seed=0))
  rows = [list(zip(_segments(batch, 'inputs', r), _segments(batch, 'targets', r)))
          for r in range(8)]
  decoded = [(tokenizer.decode(s), tokenizer.decode(t)) for row in rows for s, t in row]
  assert decoded == train[:len(decoded)]  # Data order, nothing skipped or split.
  for row, next_row in zip(rows, rows[1:]):
    # A row ends only when the next example does not fit into it.
    source, target = next_row[0]
    assert (sum(len(s) for s, _ in row) + len(source) > 40
            or sum(len(t) for _, t in row) + len(target) > 40)


def test_packing_cuts_padding_on_dates():
  def padding_fraction(pack):
    dataset = _build(_small_dates(pack=pack))
    batches = dataset.train_batches(batch_size=50, seed=0)
    arrays = [next(batches) for _ in range(4)]
    return {key: np.mean([(b[key] == 0).mean() for b in arrays]) for key in ('inputs', 'targets')}

  packed, unpacked = padding_fraction(True), padding_fraction(False)
  # Sources average ~18 tokens and targets 11 (with EOS) in rows of 64.
  assert packed['inputs'] < 0.2 and unpacked['inputs'] > 0.65
  assert packed['targets'] < 0.55 and unpacked['targets'] > 0.8


def test_unpacked_rows_hold_one_example():
  dataset = _build(_small_dates(pack=False))
  batch = next(dataset.train_batches(batch_size=16, seed=0))
  assert set(batch) == {'inputs', 'targets'}
  assert ((batch['targets'] == tokenizers.EOS_ID).sum(axis=1) == 1).all()
  assert ((batch['inputs'] == tokenizers.EOS_ID).sum(axis=1) == 1).all()
