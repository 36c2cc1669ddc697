"""Image sources through the pipeline (vit_jax.data.sources): folders of image files and TFDS
datasets, their splits, their hosts' shares and their mistakes."""

import importlib
import importlib.resources
import os
import sys

import numpy as np
import pytest
from helpers import data_config, eval_arrays, real_examples

from vit_jax.data import images
from vit_jax.data.tf_cpu import tf


# ------------------------------------------------------------------------------ image folders


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data)


def _png(pixels):
  return tf.io.encode_png(pixels).numpy()


def _make_folder(root):
  """train/{cat,dog} with RGB, grayscale and RGBA PNGs, a JPEG and a corrupt file; test/ too."""
  rng = np.random.default_rng(0)

  def rgb(height, width):
    return rng.integers(0, 256, (height, width, 3), np.uint8)

  _write(f'{root}/train/cat/a.png', _png(rgb(10, 12)))
  _write(f'{root}/train/cat/b.png', _png(rgb(6, 6)))
  _write(f'{root}/train/cat/gray.png', _png(rng.integers(0, 256, (9, 9, 1), np.uint8)))
  _write(f'{root}/train/dog/c.JPG', tf.io.encode_jpeg(rgb(16, 8)).numpy())
  _write(f'{root}/train/dog/rgba.png', _png(rng.integers(0, 256, (7, 7, 4), np.uint8)))
  _write(f'{root}/train/dog/corrupt.jpg', b'<html>not an image</html>')
  _write(f'{root}/train/dog/notes.txt', b'not an image file name')
  _write(f'{root}/test/cat/d.png', _png(rgb(8, 8)))
  _write(f'{root}/test/dog/e.jpeg', tf.io.encode_jpeg(rgb(8, 8)).numpy())
  _write(f'{root}/test/dog/f.png', _png(rng.integers(0, 256, (8, 8, 1), np.uint8)))
  truncated = _png(rgb(8, 8))
  _write(f'{root}/test/dog/truncated.png', truncated[:len(truncated) // 2])


@pytest.mark.parametrize('cache', [False, True])
def test_folder_dataset(tmp_path, capfd, cache):
  _make_folder(tmp_path)
  config = data_config(dataset=str(tmp_path), image_size=8, train_crop='resize', cache=cache)
  dataset = images.build(config, process_index=0, process_count=1)
  said = capfd.readouterr().out.splitlines()
  assert dataset.num_classes == 2 and dataset.class_names == ('cat', 'dog')
  # The corrupt file is skipped and reported; notes.txt is not an image name, so not counted,
  # but said (a folder of .webp or .tiff images would be left out without a word).
  assert dataset.skipped_files == (os.path.join(str(tmp_path), 'train', 'dog', 'corrupt.jpg'),)
  # Plain lines, as the trainer's other notes (absl's 'W1205 04:02:07.04 1404 sources.py:292]'
  # prefix before).
  assert (f'Skipped 1 of 6 files in {tmp_path}/train that are not PNG or JPEG images, e.g. '
          f'{tmp_path}/train/dog/corrupt.jpg.') in said
  assert (f'Left out 1 file(s) in {tmp_path}/train whose names do not end in .jpg/.jpeg/.png, '
          f'e.g. {tmp_path}/train/dog/notes.txt (convert them to PNG or JPEG to use them).') in said
  assert dataset.num_train_examples == 5
  assert dataset.num_test_examples == 4  # truncated.png looks like a PNG until it is decoded.

  # Eval: the truncated PNG fails to decode and is dropped, named on stderr; labels are sorted
  # class indices.
  eval_images, labels, masks, num_batches = eval_arrays(dataset, batch_size=4)
  assert num_batches == 1 and masks.tolist() == [1.0, 1.0, 1.0, 0.0]
  assert (f'warning: {tmp_path}/test/dog/truncated.png could not be decoded (TensorFlow says '
          'why above); evaluation leaves it out.') in capfd.readouterr().err
  assert sorted(labels[:3].tolist()) == [0, 1, 1]
  gray = eval_images[:3][(eval_images[:3, ..., 0] == eval_images[:3, ..., 1]).all(axis=(1, 2))]
  assert len(gray) == 1  # The grayscale test PNG came out as 3 equal channels.

  iterator = dataset.train_batches(batch_size=4, seed=0)
  for _ in range(5):  # Several epochs over images of different sizes and channel counts.
    batch = next(iterator)
    assert batch['image'].shape == (4, 8, 8, 3) and set(batch['label'].tolist()) <= {0, 1}


@pytest.mark.parametrize('test_size', [8, 7])  # Two batches of 4 exactly, and one short.
def test_a_cached_test_split_is_decoded_once(tmp_path, capfd, test_size):
  """With config.data.cache, the next evaluations read the decoded test images kept in memory,
  also when they fill their last batch exactly (TensorFlow then discarded what it had cached
  at the end of every pass, and said so on stderr)."""
  from vit_jax.data import make_image_folder  # pylint: disable=g-import-not-at-top
  make_image_folder.make(str(tmp_path), size=8, train_size=60, test_size=test_size)
  dataset = images.build(data_config(dataset=str(tmp_path), image_size=8, cache=True), 0, 1)
  first = eval_arrays(dataset, batch_size=4)
  os.rename(tmp_path / 'test', tmp_path / 'gone')  # Only the cache has them now.
  for _ in range(2):
    again = eval_arrays(dataset, batch_size=4)
    for a, b in zip(first, again):
      np.testing.assert_array_equal(a, b)
  assert 'cache' not in capfd.readouterr().err


@pytest.mark.parametrize('folder, overrides', [
    (False, dict(mixup_alpha=0.2, randaugment_layers=2, randaugment_magnitude=9)),
    (True, dict(train_crop='resize')),
    (True, dict(train_crop='inception_crop', randaugment_layers=1, randaugment_magnitude=5)),
    (True, dict(train_crop='resize', cache=True)),
])
def test_pipelines_trace_their_functions_without_autograph(tmp_path, monkeypatch, folder,
                                                           overrides):
  """Every function given to tf.data is traced as written: AutoGraph's source rewrite took
  most of each pipeline's build time, and a function that needed it would now fail here."""
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  converted = []
  convert = api._convert_actual  # pylint: disable=protected-access
  monkeypatch.setattr(api, '_convert_actual',
                      lambda entity, *args: converted.append(entity) or convert(entity, *args))
  if folder:
    _make_folder(tmp_path)
    overrides = dict(dataset=str(tmp_path), image_size=8, **overrides)
  dataset = images.build(data_config(**overrides), process_index=0, process_count=1)
  batch = next(dataset.train_batches(batch_size=4, seed=0))
  assert batch['image'].shape == (4, *dataset.image_shape)
  assert next(iter(dataset.eval_batches(4)))['image'].shape == (4, *dataset.image_shape)
  assert not converted, converted


def test_folder_hosts_share_the_test_split(tmp_path):
  _make_folder(tmp_path)
  config = data_config(dataset=str(tmp_path))
  everything = real_examples(images.build(config, process_index=0, process_count=1), 2)
  shares = [real_examples(images.build(config, process_index=i, process_count=2), 2)
            for i in range(2)]
  assert len(everything) == 3  # 4 test files, one of them undecodable.
  assert sorted(shares[0] + shares[1]) == sorted(everything)


def test_folder_without_images_is_a_clear_error(tmp_path):
  os.makedirs(tmp_path / 'train' / 'cat')
  os.makedirs(tmp_path / 'test' / 'cat')
  with pytest.raises(ValueError, match=r'No images in .*train.*expected the layout'):
    images.build(data_config(dataset=str(tmp_path)), process_index=0, process_count=1)


def test_folder_of_other_image_types_says_to_convert_them(tmp_path):
  for split in ('train', 'test'):
    _write(f'{tmp_path}/{split}/cat/a.webp', b'RIFF\x00\x00\x00\x00WEBPVP8 ')
  with pytest.raises(ValueError, match=r"No \.jpg/\.jpeg/\.png images in '.*train': its 1 "
                                       r"file\(s\) are of other types \(e\.g\. .*a\.webp\); "
                                       r"convert them to PNG or JPEG\."):
    images.build(data_config(dataset=str(tmp_path)), process_index=0, process_count=1)


def test_a_folder_of_one_class_is_a_clear_error(tmp_path):
  # It trained to 100% accuracy and a loss of 0 at its first step.
  for split in ('train', 'test'):
    _write(f'{tmp_path}/{split}/cat/a.png', _png(np.zeros((4, 4, 3), np.uint8)))
  with pytest.raises(ValueError, match=r"^Train folder '.*train' has one class folder, 'cat': a "
                                       r'classifier needs two or more\. Expected the layout '):
    images.build(data_config(dataset=str(tmp_path)), process_index=0, process_count=1)


def test_folder_without_test_split_is_a_clear_error(tmp_path):
  _write(f'{tmp_path}/train/cat/a.png', _png(np.zeros((4, 4, 3), np.uint8)))
  with pytest.raises(ValueError, match=r"has no 'test' subdirectory"):
    images.build(data_config(dataset=str(tmp_path)), process_index=0, process_count=1)


# ------------------------------------------------------------------------------ TFDS


def test_tfds_dataset_through_build_with_mock_data():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(num_examples=10):
    dataset = images.build(data_config(dataset='cifar10', image_size=16, train_crop='inception_crop',
                                   flip=True), process_index=0, process_count=1)
    assert dataset.num_classes == 10
    assert len(dataset.class_names) == 10  # The TFDS label feature's names.
    assert dataset.image_shape == (16, 16, 3)
    assert dataset.num_test_examples == 10
    _, labels, masks, num_batches = eval_arrays(dataset, batch_size=4)
    assert num_batches == 3 and masks.tolist() == [1.0] * 10 + [0.0] * 2
    assert set(labels[:10].tolist()) <= set(range(10))
    batch = next(dataset.train_batches(batch_size=4, seed=0))
    assert batch['image'].shape == (4, 16, 16, 3)
    assert -1.0 <= batch['image'].min() and batch['image'].max() <= 1.0


def _store_tiny_tfds_dataset(data_dir, monkeypatch):
  """Prepares 'tiny_images' (train 10, test 7 examples; test label = example id) in data_dir."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    importlib.import_module('importlib_resources')
  except ImportError:  # TFDS's dataset writer wants it; the standard library's module does.
    monkeypatch.setitem(sys.modules, 'importlib_resources', importlib.resources)
  rng = np.random.default_rng(0)

  def split(num_examples):
    pixels = rng.integers(0, 256, (num_examples, 6, 5, 3), np.uint8)
    return tf.data.Dataset.from_tensor_slices({'image': pixels, 'label': np.arange(num_examples)})

  features = tfds.features.FeaturesDict({
      'image': tfds.features.Image(shape=(None, None, 3)),
      'label': tfds.features.ClassLabel(num_classes=10),
  })
  tfds.dataset_builders.store_as_tfds_dataset(
      name='tiny_images', version='1.0.0', features=features, data_dir=str(data_dir),
      split_datasets={'train': split(10), 'test': split(7)})


def test_tfds_two_hosts_share_a_prepared_dataset(tmp_path, monkeypatch):
  _store_tiny_tfds_dataset(tmp_path, monkeypatch)
  config = data_config(dataset='tiny_images', tfds_data_dir=str(tmp_path), image_size=4)
  hosts = [images.build(config, process_index=i, process_count=2) for i in range(2)]
  assert hosts[0].num_train_examples == 10 and hosts[0].num_test_examples == 7
  assert [host.local_num_test_examples for host in hosts] == [4, 3]
  assert hosts[0].num_eval_batches(3) == hosts[1].num_eval_batches(3) == 2
  labels = []
  for host in hosts:
    _, host_labels, masks, _ = eval_arrays(host, batch_size=3)
    labels.extend(host_labels[masks == 1].tolist())
  assert sorted(labels) == list(range(7))  # Each test example exactly once across hosts.
  batch = next(hosts[1].train_batches(batch_size=2, seed=0))
  assert batch['image'].shape == (2, 4, 4, 3)


def test_unprepared_tfds_dataset_is_a_clear_error(tmp_path):
  config = data_config(dataset='mnist', tfds_data_dir=str(tmp_path), tfds_download=False)
  with pytest.raises(RuntimeError) as error:
    images.build(config, process_index=0, process_count=1)
  message = str(error.value)
  assert "'mnist' is not prepared" in message and str(tmp_path) in message
  assert 'tfds build mnist' in message and 'tfds_data_dir' in message


# ------------------------------------------------------------------------------ mistakes


def test_unknown_dataset_name_says_what_was_tried():
  with pytest.raises(ValueError) as error:
    images.build(data_config(dataset='cifar1O'), process_index=0, process_count=1)
  message = str(error.value)
  assert "Unknown dataset 'cifar1O'" in message
  assert "not 'digits'" in message and 'not an existing directory' in message
  assert 'TFDS' in message and 'cifar10' in message  # The close TFDS name is suggested.


def test_missing_folder_path_is_a_clear_error(tmp_path):
  missing = str(tmp_path / 'my_images')
  with pytest.raises(ValueError, match=r"Image folder '.*my_images' .* does not exist; expected"):
    images.build(data_config(dataset=missing), process_index=0, process_count=1)


def test_a_train_class_folder_without_images_is_a_clear_error(tmp_path):
  _make_folder(tmp_path)
  os.makedirs(tmp_path / 'train' / 'checkpoints' / '0')  # Not a class: holds no image.
  with pytest.raises(ValueError, match=r"Train folder '.*train' has class folders with no "
                                       r"images: \['checkpoints'\]; remove them"):
    images.build(data_config(dataset=str(tmp_path)), process_index=0, process_count=1)
