"""Tests for the translation input pipeline (vit_jax.data.text) on generated data: the train
stream, evaluation batches, hosts' shares and config mistakes."""

import subprocess
import sys

import numpy as np
import pytest

from vit_jax.data import dates, text_config

from helpers import build_text, small_dates_config, text_data_config, write_lines


@pytest.fixture(scope='module')
def default_dates():
  return build_text(text_config.default_config())


# ------------------------------------------------------------------------------ train stream


@pytest.mark.parametrize('shuffle_buffer', [0, 1, 50])
def test_start_step_resumes_the_exact_stream(shuffle_buffer):
  dataset = build_text(small_dates_config(shuffle_buffer=shuffle_buffer))
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
  dataset = build_text(small_dates_config(pack=False))
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
  config = small_dates_config(dates_train_size=101, dates_test_size=51, pack=False,
                              shuffle_buffer=1)
  hosts = [build_text(config, process_index=i, process_count=2) for i in range(2)]
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


# ------------------------------------------------------------------------------ config


def test_config_mistakes_are_named():
  with pytest.raises(ValueError, match="Unknown text data config keys.*'max_len'"):
    build_text({'max_len': 8})
  with pytest.raises(ValueError, match="tokenizer='words'"):
    build_text(text_data_config(tokenizer='words'))
  with pytest.raises(ValueError, match="long_examples='drop'"):
    build_text(text_data_config(long_examples='drop'))
  with pytest.raises(ValueError, match="only has splits 'train'"):
    build_text(text_data_config(test_split='validation'))
  with pytest.raises(ValueError, match=r'process_index=2 must be in \[0, process_count=2\)'):
    build_text(text_data_config(), process_index=2, process_count=2)


def test_dates_and_files_run_without_tensorflow(tmp_path):
  """TensorFlow (about 0.6 GB resident) loads for TFDS datasets only."""
  write_lines(tmp_path / 'a.src', ['one', 'two'])
  write_lines(tmp_path / 'a.tgt', ['eins', 'zwei'])
  files = f'{tmp_path}/a.src,{tmp_path}/a.tgt'
  code = ('import sys\n'
          'from vit_jax.data import text, text_config\n'
          "text.build({'dates_train_size': 50, 'dates_test_size': 5}, process_index=0, "
          'process_count=1)\n'
          f"text.build({{'dataset': 'files', 'train_files': {files!r}, 'eval_files': {files!r}, "
          "'tokenizer': 'bytes'}, process_index=0, process_count=1)\n"
          'assert "tensorflow" not in sys.modules, "tensorflow was imported"\n')
  subprocess.run([sys.executable, '-c', code], check=True)
