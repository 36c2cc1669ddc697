"""Resuming the image train stream (vit_jax.data.train_order, images.train_batches).

Each test counts what the resumed pipeline reads: the indices it asks its source for, the
examples a TFDS data source returns, and the image files the process opens (inotify). A resumed
run must read nothing before its resume point and give the batches of a run that never stopped,
on one host and on each of two.
"""

import ctypes
import dataclasses
import os
import struct

import numpy as np
import pytest
from helpers import assert_resumed_run_repeats, override

from vit_jax.data import images, train_order
from vit_jax.data.tf_cpu import tf
from vit_jax.train import config as config_lib

BATCH = 4


def _config(**overrides):
  config = images.default_config()
  config.update({'prefetch': 1, **overrides})
  return config


class ReadLog:
  """Wraps a dataset's source so that every train index it reads is recorded."""

  def __init__(self, dataset):
    self.indices = []
    source = dataset._source  # pylint: disable=protected-access
    read = source.read_train

    def record(index):  # One index, or a batch of them.
      self.indices.extend(np.atleast_1d(index).tolist())
      return index

    def counted(index):
      logged = tf.numpy_function(record, [index], tf.int64, stateful=True)
      return read(tf.ensure_shape(logged, index.shape))

    dataset._source = dataclasses.replace(source, read_train=counted)


def _order(dataset, seed, positions):
  """The record index at each position of the host's stream, as the pipeline computes it."""
  shuffle_seed = dataset._seeds(seed)[0]  # pylint: disable=protected-access
  n = dataset._source.local_num_train_examples  # pylint: disable=protected-access
  return [int(train_order.record_index(tf.constant(p, tf.int64), n, shuffle_seed))
          for p in positions]


def _batches(dataset, count, start_step=0, seed=0):
  stream = dataset.train_batches(BATCH, seed=seed, start_step=start_step)
  return [next(stream) for _ in range(count)]


def _assert_same(resumed, expected):
  assert len(resumed) == len(expected)
  for got, want in zip(resumed, expected):
    np.testing.assert_array_equal(got['image'], want['image'])
    np.testing.assert_array_equal(got['label'], want['label'])


def _check_resume(build, steps: int, resume_step: int, seed: int = 0):
  """Resumes `build()`'s stream at `resume_step`; returns (reads, order before, order after)."""
  expected = _batches(build(), steps, seed=seed)
  resumed_dataset = build()
  log = ReadLog(resumed_dataset)
  resumed = _batches(resumed_dataset, steps - resume_step, resume_step, seed)
  _assert_same(resumed, expected[resume_step:])
  start = resume_step * BATCH
  n = resumed_dataset.local_num_train_examples
  before = _order(resumed_dataset, seed, range(start - start % n, start))
  after = _order(resumed_dataset, seed, range(start, start + len(log.indices)))
  return log.indices, before, after


def _assert_reads_nothing_before(reads, before, after, n):
  assert reads, 'the counter saw no reads'
  assert len(reads) <= n  # Never more than an epoch, whatever the step.
  assert sorted(reads) == sorted(after)  # Exactly the positions from the resume point on.
  assert not set(reads) & (set(before) - set(after))


# ------------------------------------------------------------------------------ digits


@pytest.mark.parametrize('resume_step', [30, 1000])  # In epoch 0, and in epoch 2 (1437 images).
@pytest.mark.parametrize('process_count', [1, 2])
def test_digits_resume_reads_from_the_resume_point_on(resume_step, process_count):
  for index in range(process_count):
    def build():
      return images.build(_config(mixup_alpha=0.2), process_index=index,
                          process_count=process_count)
    reads, before, after = _check_resume(build, resume_step + 3, resume_step)
    _assert_reads_nothing_before(reads, before, after, build().local_num_train_examples)


def test_digits_uninterrupted_stream_reads_what_the_counter_sees():
  dataset = images.build(_config())
  log = ReadLog(dataset)
  _batches(dataset, 5)
  assert set(_order(dataset, 0, range(5 * BATCH))) <= set(log.indices)


def test_epochs_are_permutations_and_differ():
  n = 37
  epochs = [_order_of(n, seed=5, epoch=e) for e in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(n))
  assert epochs[0] != epochs[1] != epochs[2]
  assert _order_of(n, seed=None, epoch=1) == list(range(n))


def _order_of(n, seed, epoch):
  positions = tf.range(epoch * n, (epoch + 1) * n, dtype=tf.int64)
  return [int(train_order.record_index(p, n, seed)) for p in positions]


# ------------------------------------------------------------------------------ image folders


class FileOpens:
  """The names of files opened in some directories, from Linux inotify (every process's opens)."""
  _IN_OPEN, _IN_NONBLOCK = 0x20, 0o4000

  def __init__(self, directories):
    self._libc = ctypes.CDLL(None, use_errno=True)
    self._fd = self._libc.inotify_init1(self._IN_NONBLOCK)
    if self._fd < 0:
      pytest.skip('inotify is not available here')
    self._dirs = {}
    for directory in directories:
      wd = self._libc.inotify_add_watch(self._fd, directory.encode(), self._IN_OPEN)
      self._dirs[wd] = directory

  def names(self) -> list[str]:
    opened = []
    while True:
      try:
        data = os.read(self._fd, 65536)
      except BlockingIOError:
        break
      offset = 0
      while offset < len(data):
        wd, _, _, length = struct.unpack_from('iIII', data, offset)
        name = data[offset + 16:offset + 16 + length].rstrip(b'\0').decode()
        opened.append(os.path.join(self._dirs[wd], name))
        offset += 16 + length
    return opened

  def close(self):
    os.close(self._fd)


def _make_folder(root, num_per_class=20):
  """train/{a,b}: PNGs and JPEGs of varying sizes, one non-image .jpg and one truncated JPEG."""
  rng = np.random.default_rng(0)
  for label in ('a', 'b'):
    os.makedirs(f'{root}/train/{label}')
    os.makedirs(f'{root}/test/{label}')
    for i in range(num_per_class):
      pixels = rng.integers(0, 256, (6 + i % 5, 7 + i % 3, 3), np.uint8)
      encode = tf.io.encode_png if i % 2 else tf.io.encode_jpeg
      with open(f'{root}/train/{label}/{i:02d}.{"png" if i % 2 else "jpg"}', 'wb') as f:
        f.write(encode(pixels).numpy())
    with open(f'{root}/test/{label}/0.png', 'wb') as f:
      f.write(tf.io.encode_png(rng.integers(0, 256, (8, 8, 3), np.uint8)).numpy())
  with open(f'{root}/train/a/html.jpg', 'wb') as f:
    f.write(b'<html>not an image</html>')
  jpeg = tf.io.encode_jpeg(rng.integers(0, 256, (40, 40, 3), np.uint8)).numpy()
  with open(f'{root}/train/b/truncated.jpg', 'wb') as f:
    f.write(jpeg[:len(jpeg) // 3])


def _path(dataset, index):
  record = dataset._source.read_train(tf.constant(index, tf.int64))
  return record['path'].numpy().decode()


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('folder'))
  _make_folder(root)
  return root


@pytest.mark.parametrize('process_count', [1, 2])
def test_folder_with_corrupt_files_resumes_reading_only_from_the_resume_point(folder,
                                                                              process_count):
  config = _config(dataset=folder, image_size=8, train_crop='inception_crop', flip=True)
  for index in range(process_count):
    def build():
      return images.build(config, process_index=index, process_count=process_count)
    dataset = build()
    n = dataset.local_num_train_examples  # 41 images (the html file is left out at listing).
    assert n == (41 + process_count - 1 - index) // process_count
    resume_step = 2 * n // BATCH + 1  # In epoch 2.
    expected = _batches(build(), resume_step + 3)
    resumed_dataset = build()  # Lists the folder (and reads each file's signature) first.
    opens = FileOpens([f'{folder}/train/a', f'{folder}/train/b'])
    log = ReadLog(resumed_dataset)
    resumed = _batches(resumed_dataset, 3, resume_step)
    opened = opens.names()
    opens.close()
    _assert_same(resumed, expected[resume_step:])
    start = resume_step * BATCH
    after = _order(resumed_dataset, 0, range(start, start + len(log.indices)))
    # Exactly the positions from the resume point on: the 3 batches and the read-ahead, which
    # on 20 records can pass an epoch, but never the `start` records before the resume point.
    assert sorted(log.indices) == sorted(after) and len(log.indices) < start
    # The files opened are those of the records read (some may still be in flight).
    read_paths = {_path(dataset, i) for i in log.indices}
    assert opened and set(opened) <= read_paths and len(opened) <= len(log.indices)


def test_a_truncated_image_keeps_its_place_and_is_replaced_within_its_batch(folder, capfd):
  dataset = images.build(_config(dataset=folder, image_size=8, train_crop='resize',
                                 shuffle_buffer=1))
  paths = [_path(dataset, i) for i in range(dataset.local_num_train_examples)]
  bad = paths.index(f'{folder}/train/b/truncated.jpg')
  batches = _batches(dataset, bad // BATCH + 1)
  # Named on stderr (TensorFlow's own warning says why, not which file).
  assert (f'warning: {folder}/train/b/truncated.jpg could not be decoded (TensorFlow says why '
          'above); another image of its batch takes its place.') in capfd.readouterr().err
  row = bad % BATCH
  batch = batches[-1]
  others = [r for r in range(BATCH) if r != row]
  # The failed row holds a copy of another row of the same batch, with its label.
  assert any(np.array_equal(batch['image'][row], batch['image'][r]) and
             batch['label'][row] == batch['label'][r] for r in others)
  # Every other batch of the epoch is untouched: positions did not shift.
  in_order = images.build(_config(dataset=folder, image_size=8, train_crop='resize',
                                  shuffle_buffer=1))
  np.testing.assert_array_equal(
      _batches(in_order, bad // BATCH + 2)[-1]['label'],
      [dataset._source.read_train(tf.constant(i, tf.int64))['label'].numpy()
       for i in range((bad // BATCH + 1) * BATCH, (bad // BATCH + 2) * BATCH)])


def test_training_on_a_folder_with_corrupt_files_resumes_like_it_never_stopped(folder, tmp_path):
  config = override(config_lib.classification_config('ViT-testing'), {
      'model.patch_size': (4, 4), 'data.dataset': folder, 'data.image_size': 8,
      'data.train_crop': 'inception_crop', 'data.flip': True, 'batch_size': 8,
      'eval_batch_size': 4, 'total_steps': 8, 'log_every': 1, 'eval_every': 0,
      'checkpoint_every': 4, 'keep_checkpoints': 3})
  # As if killed between the checkpoints at steps 4 and 8; the second epoch starts in step 6.
  assert_resumed_run_repeats(config, tmp_path, last_step=8, resume_step=4)


# ------------------------------------------------------------------------------ TFDS


@pytest.mark.parametrize('process_count', [1, 2])
def test_tfds_mock_data_resumes_reading_only_from_the_resume_point(monkeypatch, process_count):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.core.data_sources import array_record
  reads = []
  original = array_record.ArrayRecordDataSource.__getitem__

  def counted(self, key):
    reads.append(int(key))
    return original(self, key)

  monkeypatch.setattr(array_record.ArrayRecordDataSource, '__getitem__', counted)
  with tfds.testing.mock_data(num_examples=50):
    for index in range(process_count):
      def build():
        return images.build(_config(dataset='cifar10', image_size=8, train_crop='inception_crop',
                                    flip=True), process_index=index, process_count=process_count)
      dataset = build()
      n = dataset.local_num_train_examples
      assert dataset._source.read_train is not None  # pylint: disable=protected-access
      resume_step = 3 * n // BATCH + 2
      expected = _batches(build(), resume_step + 2)
      resumed_dataset = build()
      del reads[:]
      resumed = _batches(resumed_dataset, 2, resume_step)
      _assert_same(resumed, expected[resume_step:])
      start = resume_step * BATCH
      assert 0 < len(reads) < start
      assert sorted(reads) == sorted(_order(resumed_dataset, 0, range(start, start + len(reads))))


def test_tfds_tfrecord_stream_resumes_with_the_same_batches(tmp_path, monkeypatch):
  import test_data_sources  # pylint: disable=g-import-not-at-top
  test_data_sources._store_tiny_tfds_dataset(tmp_path, monkeypatch)

  def build():
    return images.build(_config(dataset='tiny_images', tfds_data_dir=str(tmp_path),
                                image_size=4), process_index=0, process_count=1)
  assert build()._source.read_train is None  # pylint: disable=protected-access
  expected = _batches(build(), 8)
  _assert_same(_batches(build(), 3, start_step=5), expected[5:])


# --------------------------------------------------------------- repeated augmentation


def test_repeats_give_each_draw_of_the_order_that_many_times_in_a_row():
  n, seed = 37, 5
  positions = tf.range(3 * 2 * n, dtype=tf.int64)  # Two epochs of draws, three copies each.
  repeated = train_order.record_index(positions, n, seed, repeats=3).numpy()
  draws = train_order.record_index(tf.range(2 * n, dtype=tf.int64), n, seed).numpy()
  np.testing.assert_array_equal(repeated, np.repeat(draws, 3))


def _rows_in_threes(batch):
  labels = batch['label'].reshape(-1, 3)
  assert (labels == labels[:, :1]).all()
  copies = batch['image'].reshape(-1, 3, *batch['image'].shape[1:])
  return copies


@pytest.mark.parametrize('process_count', [1, 2])
def test_digits_copies_come_in_a_row_augmented_apart_and_resume(process_count):
  def build():
    return images.build(_config(repeated_augmentation=3, crop_padding=2), process_index=0,
                        process_count=process_count)
  stream = build().train_batches(12, seed=0)
  batches = [next(stream) for _ in range(4)]
  differing = [not np.array_equal(copies[:, 0], copies[:, 1])
               for copies in map(_rows_in_threes, batches)]
  assert all(differing)  # Each copy has its own crop.
  resumed = build().train_batches(12, seed=0, start_step=2)
  _assert_same([next(resumed), next(resumed)], batches[2:])


def test_folder_and_tfrecord_stream_copies_come_in_a_row_and_resume(tmp_path, monkeypatch):
  import test_data_sources  # pylint: disable=g-import-not-at-top
  test_data_sources._store_tiny_tfds_dataset(tmp_path, monkeypatch)
  _make_folder(tmp_path / 'folder')
  for bad in ('a/html.jpg', 'b/truncated.jpg'):  # A failed copy would take another's place.
    os.remove(tmp_path / 'folder' / 'train' / bad)
  for fields in ({'dataset': str(tmp_path / 'folder'), 'image_size': 8,
                  'train_crop': 'inception_crop'},
                 {'dataset': 'tiny_images', 'tfds_data_dir': str(tmp_path), 'image_size': 4}):
    def build():
      return images.build(_config(**fields, repeated_augmentation=3), process_index=0,
                          process_count=1)
    stream = build().train_batches(6, seed=0)
    expected = [next(stream) for _ in range(3)]
    for batch in expected:
      _rows_in_threes(batch)
    _assert_same([next(build().train_batches(6, seed=0, start_step=2))], expected[2:])
