"""The image input pipeline (vit_jax.data.images) on the embedded digits: splits, eval and
train batches, crops, RandAugment, hosts' shares (image folders and TFDS: test_data_sources)."""

import subprocess
import sys

import numpy as np
import pytest
from helpers import data_config, eval_arrays, real_examples

from vit_jax.data import augment
from vit_jax.data import images
from vit_jax.data import sources
from vit_jax.data.tf_cpu import tf


@pytest.fixture(scope='module')
def digits():
  return images.build(images.default_config(), process_index=0, process_count=1)


# ------------------------------------------------------------------------------ digits


def test_digits_split_sizes_and_shapes(digits):
  assert digits.num_classes == 10
  assert digits.class_names == tuple('0123456789')
  assert digits.num_train_examples == 1437
  assert digits.num_test_examples == 360
  assert digits.local_num_test_examples == 360
  assert digits.image_shape == (8, 8, 3)


def test_digits_split_is_pinned():
  # The test split must be the same on every machine, or reported accuracies are not comparable.
  splits = sources.digits_splits()
  assert splits['test'][1][:12].tolist() == [6, 6, 6, 2, 5, 6, 6, 2, 2, 1, 1, 9]
  assert np.bincount(splits['test'][1]).tolist() == [29, 38, 33, 40, 33, 39, 32, 42, 41, 33]


def test_digits_eval_images_are_the_digits_scaled_to_unit_range(digits):
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  raw = datasets.load_digits()
  eval_images, labels, masks, _ = eval_arrays(digits, 360)
  assert masks.tolist() == [1.0] * 360
  assert eval_images.min() == -1.0 and eval_images.max() == 1.0
  # Gray is repeated to 3 channels; pixel values 0..16 map linearly onto [-1, 1].
  np.testing.assert_array_equal(eval_images[..., 0], eval_images[..., 2])
  test_ids = np.random.default_rng(0).permutation(1797)[:360]
  np.testing.assert_allclose(eval_images[..., 0], raw.images[test_ids] / 8.0 - 1.0, atol=1 / 127.5)
  np.testing.assert_array_equal(labels, raw.target[test_ids])


def test_eval_counts_every_example_once_and_masks_padding(digits):
  batch_size = 64  # 360 = 5 * 64 + 40: the last batch holds 24 padding examples.
  eval_images, labels, masks, num_batches = eval_arrays(digits, batch_size)
  assert num_batches == digits.num_eval_batches(batch_size) == 6
  assert masks.tolist() == [1.0] * 360 + [0.0] * 24
  np.testing.assert_array_equal(labels[:360], sources.digits_splits()['test'][1])
  assert not eval_images[360:].any()  # Padding is zeros.


def test_eval_is_deterministic(digits):
  first, _, _, _ = eval_arrays(digits, 100)
  again, _, _, _ = eval_arrays(digits, 100)
  rebuilt, _, _, _ = eval_arrays(images.build(data_config(), process_index=0, process_count=1), 100)
  np.testing.assert_array_equal(first, again)
  np.testing.assert_array_equal(first, rebuilt)


def test_eval_resize_ratio_takes_the_central_window(digits):
  # Resize to 4 * 2 = 8 (the digits' own size, so no resampling), then keep the central 4x4.
  cropped = images.build(data_config(image_size=4, eval_resize_ratio=2.0), process_index=0,
                         process_count=1)
  full, _, _, _ = eval_arrays(digits, 360)
  center, _, _, _ = eval_arrays(cropped, 360)
  np.testing.assert_array_equal(center, full[:, 2:6, 2:6, :])


def test_shorter_side_eval_keeps_the_aspect_ratio_and_takes_the_central_window():
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  pixels = np.random.default_rng(0).integers(0, 256, (2, 10, 24, 3), np.uint8)

  def crop(batch, size, how='shorter_side'):
    return preprocess.resize_center_crop(tf.constant(batch), size, 1.25, how).numpy()

  # The shorter side 10 is already 8 * 1.25: no resampling, the central 8 of 10 rows and of 24
  # columns.
  np.testing.assert_array_equal(crop(pixels, 8), pixels[:, 1:9, 8:16])
  np.testing.assert_array_equal(crop(pixels.transpose(0, 2, 1, 3), 8),
                                pixels[:, 1:9, 8:16].transpose(0, 2, 1, 3))
  # Halved: 5x12 (12 = floor(5 * 24 / 10)), the central 4x4 at rows 0..4, columns 4..8.
  resized = tf.image.resize(pixels, (5, 12), antialias=True).numpy()
  np.testing.assert_array_equal(crop(pixels, 4), np.round(resized[:, 0:4, 4:8]))
  # 'square' squeezes the 10x24 pictures to 10x10 instead.
  assert np.abs(crop(pixels, 8, 'square').astype(int) - crop(pixels, 8)).max() > 64


def test_train_batches_shape_range_and_reproducibility(digits):
  def first_batches(seed):
    iterator = digits.train_batches(batch_size=32, seed=seed)
    return [next(iterator) for _ in range(3)]

  batches = first_batches(seed=7)
  for batch in batches:
    assert batch['image'].shape == (32, 8, 8, 3) and batch['image'].dtype == np.float32
    assert batch['label'].shape == (32,) and batch['label'].dtype == np.int32
    assert -1.0 <= batch['image'].min() and batch['image'].max() <= 1.0
    assert set(batch['label'].tolist()) <= set(range(10))
  for batch, again in zip(batches, first_batches(seed=7)):
    np.testing.assert_array_equal(batch['image'], again['image'])
    np.testing.assert_array_equal(batch['label'], again['label'])
  other = first_batches(seed=8)
  assert any(not np.array_equal(a['label'], b['label']) for a, b in zip(batches, other))


def test_train_batches_are_shuffled_epochs_that_never_end(digits):
  # 'resize' at the native size and no flip: train images are the digits themselves.
  plain = images.build(data_config(train_crop='resize'), process_index=0, process_count=1)
  batch_size = 479  # 1437 = 3 * 479: one epoch is exactly three batches.
  iterator = plain.train_batches(batch_size=batch_size, seed=0)
  for _ in range(2):  # Two epochs, each a permutation of the train split.
    epoch = [next(iterator) for _ in range(3)]
    labels = np.concatenate([b['label'] for b in epoch])
    np.testing.assert_array_equal(np.sort(labels), np.sort(sources.digits_splits()['train'][1]))
  assert not np.array_equal(labels, np.sort(labels))


@pytest.mark.parametrize('train_crop', images.TRAIN_CROPS)
@pytest.mark.parametrize('channels,interpolation', [(1, 'bilinear'), (3, 'bilinear'),
                                                    (3, 'bicubic')])
def test_train_crops_give_model_sized_images(train_crop, channels, interpolation):
  config = data_config(train_crop=train_crop, image_size=12, channels=channels, flip=True,
                       train_interpolation=interpolation)
  dataset = images.build(config, process_index=0, process_count=1)
  batch = next(dataset.train_batches(batch_size=16, seed=0))
  assert dataset.image_shape == (12, 12, channels)
  assert batch['image'].shape == (16, 12, 12, channels) and batch['image'].dtype == np.float32
  assert -1.0 <= batch['image'].min() and batch['image'].max() <= 1.0
  eval_batch = next(dataset.eval_batches(batch_size=16))
  assert eval_batch['image'].shape == (16, 12, 12, channels)


def test_mixup_gives_soft_labels_that_sum_to_one():
  dataset = images.build(data_config(mixup_alpha=0.4), process_index=0, process_count=1)
  batch = next(dataset.train_batches(batch_size=64, seed=0))
  labels = batch['label']
  assert labels.shape == (64, 10) and labels.dtype == np.float32
  np.testing.assert_allclose(labels.sum(axis=1), 1.0, rtol=1e-6)
  assert labels.min() >= 0.0
  assert ((labels > 0).sum(axis=1) == 2).any()  # Some examples are mixes of two classes.
  assert -1.0 <= batch['image'].min() and batch['image'].max() <= 1.0
  eval_batch = next(dataset.eval_batches(batch_size=64))
  assert eval_batch['label'].dtype == np.int32  # Eval labels stay class ids.


def test_randaugment_through_build_changes_images_and_keeps_shape():
  plain = next(images.build(data_config(), process_index=0, process_count=1).train_batches(64, seed=0))
  config = data_config(randaugment_layers=2, randaugment_magnitude=9)
  augmented = next(images.build(config, process_index=0, process_count=1).train_batches(64, seed=0))
  assert augmented['image'].shape == plain['image'].shape == (64, 8, 8, 3)
  assert augmented['image'].dtype == np.float32
  np.testing.assert_array_equal(augmented['label'], plain['label'])  # Same order, same seed.
  assert not np.array_equal(augmented['image'], plain['image'])


# ------------------------------------------------------------------------------ RandAugment ops


@pytest.mark.parametrize('name', sorted(augment.RANDAUGMENT_OPS))
@pytest.mark.parametrize('channels', [1, 3])
def test_randaugment_op_keeps_shape_and_dtype(name, channels):
  image = tf.constant(np.random.default_rng(0).integers(0, 256, (10, 7, channels), np.uint8))
  out = augment.RANDAUGMENT_OPS[name](image, 1.0, -1.0, 128)
  assert out.shape == (10, 7, channels) and out.dtype == tf.uint8


def test_randaugment_is_seeded_and_keeps_shape():
  image = tf.constant(np.random.default_rng(0).integers(0, 256, (9, 9, 3), np.uint8))
  seed = tf.constant([3, 4], tf.int64)
  out = augment.randaugment(image, num_layers=3, magnitude=10, seed=seed)
  assert out.shape == (9, 9, 3) and out.dtype == tf.uint8
  np.testing.assert_array_equal(out, augment.randaugment(image, 3, 10, seed))


@pytest.mark.parametrize('interpolation', images.INTERPOLATIONS)
def test_inception_crop_mirrors_in_the_crop_as_random_flip_would(interpolation):
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  pixels = np.random.default_rng(0).integers(0, 256, (16, 30, 40, 3), np.uint8)
  crop_seed, flip_seed = tf.constant([1, 2], tf.int64), tf.constant([3, 4], tf.int64)
  flipped = preprocess.inception_crop(pixels, 12, crop_seed, 0.05, flip_seed,
                                      interpolation).numpy()
  unflipped = preprocess.inception_crop(pixels, 12, crop_seed, 0.05,
                                        interpolation=interpolation).numpy()
  np.testing.assert_array_equal(flipped, preprocess.random_flip(unflipped, flip_seed).numpy())
  assert 0 < sum((flipped[i] != unflipped[i]).any() for i in range(16)) < 16


@pytest.mark.parametrize('interpolation', images.INTERPOLATIONS)
@pytest.mark.parametrize('image_format', ['jpeg', 'png'])
@pytest.mark.parametrize('flip', [False, True])
def test_inception_crop_of_encoded_images_decodes_only_the_window_alike(image_format, flip,
                                                                         interpolation):
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  coarse = rng.integers(0, 256, (6, 8, 3), np.uint8)
  pixels = tf.image.resize(coarse[None], (45, 60), method='bicubic')[0]  # Smooth, like photos.
  pixels = tf.cast(tf.clip_by_value(pixels, 0, 255), tf.uint8)
  encode = tf.io.encode_jpeg if image_format == 'jpeg' else tf.io.encode_png
  encoded = encode(pixels)
  decoded = tf.io.decode_image(encoded, channels=3)
  for i in range(8):
    seed, flip_seed = tf.constant([i, 7], tf.int64), tf.constant([i, 9], tf.int64) if flip else None
    windowed = preprocess.inception_crop_encoded(encoded, 16, seed, 0.05, 3, flip_seed,
                                                 interpolation).numpy()
    whole = preprocess.inception_crop(decoded[None], 16, seed, 0.05, flip_seed,
                                      interpolation).numpy()
    difference = np.abs(windowed.astype(int) - whole)
    if image_format == 'png':
      np.testing.assert_array_equal(windowed, whole)
    else:  # A JPEG's window decodes within a few levels of the whole image, at its edges.
      assert difference.mean() < 1.0 and difference.max() <= 16


def test_bicubic_inception_crop_cuts_the_window_of_the_bilinear_one_and_antialiases():
  """On a ramp (which both kernels reproduce) the two crops agree up to the bicubic window's
  rounding to whole pixels, mirrored alike; on a one-pixel checkerboard shrunk 8 times the
  bicubic crop is gray, as PIL's antialiased resize (timm, DeiT) gives, where bilinear
  sampling without antialiasing keeps whole black and white pixels."""
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  rows, cols = np.mgrid[0:90, 0:120]
  ramp = np.repeat((10 + 0.5 * rows + 1.5 * cols)[..., None], 3, -1).astype(np.uint8)  # 10..233
  crop_seed, flip_seed = tf.constant([5, 6], tf.int64), tf.constant([7, 8], tf.int64)
  batch = np.stack([ramp] * 16)
  bilinear = preprocess.inception_crop(batch, 24, crop_seed, 0.2, flip_seed).numpy()
  bicubic = preprocess.inception_crop(batch, 24, crop_seed, 0.2, flip_seed, 'bicubic').numpy()
  assert bicubic.shape == bilinear.shape == (16, 24, 24, 3) and bicubic.dtype == np.uint8
  # Each crop's pixels sit within a pixel of the other's: 2 levels (0.5 + 1.5) apart, plus
  # the antialiasing filter's pull at the window's edges.
  difference = np.abs(bicubic.astype(int) - bilinear)
  print('ramp: mean, max difference', difference.mean(), difference.max())
  assert difference.mean() < 1.5 and difference.max() <= 5
  assert len({crop.tobytes() for crop in bicubic}) == 16  # Windows of their own.

  checkerboard = np.repeat(((rows + cols) % 2 * 255)[:, :, None], 3, -1).astype(np.uint8)
  full = tf.constant([0, 0], tf.int64)
  shrunk = {method: preprocess.inception_crop(checkerboard[None, :64, :64], 8, full, 1.0,
                                              interpolation=method).numpy()
            for method in images.INTERPOLATIONS}
  print('checkerboard: std bilinear, bicubic', shrunk['bilinear'].std(), shrunk['bicubic'].std())
  assert np.abs(shrunk['bicubic'].astype(int) - 128).max() <= 16
  assert shrunk['bilinear'].std() > 60


def test_bicubic_crop_resizes_its_window_as_pil_does():
  """timm and DeiT resize their crop with PIL's bicubic (antialiased when shrinking): ours
  gives the same pixels within a few levels, shrinking and enlarging."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  coarse = rng.integers(0, 256, (12, 16, 3), np.uint8)
  photo = np.asarray(Image.fromarray(coarse).resize((400, 300), Image.BICUBIC))
  photo = np.clip(photo + rng.normal(0, 10, photo.shape), 0, 255).astype(np.uint8)
  for top, left, rows, cols in [(0, 0, 300, 400), (10, 20, 250, 300), (50, 60, 120, 90),
                                (5, 5, 60, 60)]:
    window = photo[top:top + rows, left:left + cols]
    ours = preprocess._resized_window(tf.constant(window), 224, tf.constant(False)).numpy()
    pil = np.asarray(Image.fromarray(window).resize((224, 224), Image.BICUBIC))
    difference = np.abs(ours.astype(int) - pil)
    print((rows, cols), 'mean, max difference', difference.mean(), difference.max())
    assert difference.mean() < 0.5 and difference.max() <= 6


def test_augment_ops_do_what_their_names_say():
  rng = np.random.default_rng(0)
  square = rng.integers(0, 256, (6, 6, 3), np.uint8)
  np.testing.assert_array_equal(augment.rotate(tf.constant(square), 90.0), np.rot90(square))
  shifted = augment.translate_x(tf.constant(square), 2.0, fill=0).numpy()
  np.testing.assert_array_equal(shifted[:, 2:], square[:, :-2])
  assert not shifted[:, :2].any()
  dull = rng.integers(100, 111, (16, 16, 1), np.uint8)
  for stretch in (augment.autocontrast, augment.equalize):
    out = stretch(tf.constant(dull)).numpy()
    assert out.min() == 0 and out.max() == 255, stretch.__name__
  levels = tf.constant([[[0], [127], [128], [255]]], tf.uint8)
  assert augment.solarize(levels, 128).numpy().ravel().tolist() == [0, 127, 127, 0]
  assert augment.posterize(levels, 1).numpy().ravel().tolist() == [0, 0, 128, 128]
  np.testing.assert_array_equal(augment.brightness(tf.constant(square), 0.0), 0)


# ------------------------------------------------------------------------------ sharding


def test_two_hosts_eval_shares_are_disjoint_and_cover_the_split(digits):
  hosts = [images.build(data_config(), process_index=i, process_count=2) for i in range(2)]
  shares = [real_examples(host, batch_size=64) for host in hosts]
  assert [len(share) for share in shares] == [180, 180]
  assert [host.local_num_test_examples for host in hosts] == [180, 180]
  assert hosts[0].num_eval_batches(64) == hosts[1].num_eval_batches(64) == 3
  everything = real_examples(digits, batch_size=64)
  assert sorted(shares[0] + shares[1]) == sorted(everything)
  assert not set(shares[0]) & set(shares[1])


def test_two_hosts_train_on_disjoint_halves():
  config = data_config(train_crop='resize')  # Unaugmented, so images identify examples.
  epochs = []
  for index, size in [(0, 719), (1, 718)]:  # 1437 train examples: the first host gets one more.
    batch = next(images.build(config, process_index=index, process_count=2).train_batches(size))
    epochs.append({image.tobytes() for image in batch['image']})
  assert not epochs[0] & epochs[1]
  train_images = sources.digits_splits()['train'][0]
  assert len(epochs[0] | epochs[1]) == len({image.tobytes() for image in train_images})


# ------------------------------------------------------------------------------ config errors


def test_config_mistakes_are_named():
  with pytest.raises(ValueError, match="Unknown data config keys.*'image_sise'"):
    images.build({'image_sise': 8}, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="train_crop='center'"):
    images.build(data_config(train_crop='center'), process_index=0, process_count=1)
  with pytest.raises(ValueError, match=r"eval_resize='shorter' \(expected one of \('square', "
                                       r"'shorter_side'\)\)"):
    images.build(data_config(eval_resize='shorter'), process_index=0, process_count=1)
  with pytest.raises(ValueError, match=r"train_interpolation='nearest' \(expected one of "
                                       r"\('bilinear', 'bicubic'\)\)"):
    images.build(data_config(train_interpolation='nearest'), process_index=0, process_count=1)
  with pytest.raises(ValueError, match="only has splits 'train'"):
    images.build(data_config(test_split='validation'), process_index=0, process_count=1)
  with pytest.raises(ValueError, match=r'process_index=2 must be in \[0, process_count=2\)'):
    images.build(data_config(), process_index=2, process_count=2)
  with pytest.raises(ValueError, match=r"shuffle_buffer=500 applies to TFDS datasets stored as "
                                       r"tfrecord.*'digits' is read by index"):
    images.build(data_config(shuffle_buffer=500), process_index=0, process_count=1)


def test_importing_images_does_not_import_tensorflow():
  # Configs import vit_jax.data.images for default_config(); that must stay cheap.
  code = ('import sys, vit_jax.data.images as m; m.default_config(); '
          'assert "tensorflow" not in sys.modules, "tensorflow was imported"')
  subprocess.run([sys.executable, '-c', code], check=True)


def test_train_batches_resume_at_a_step():
  dataset = images.build({'dataset': 'digits', 'mixup_alpha': 0.2})
  stream = dataset.train_batches(batch_size=100, seed=3)
  from_start = [next(stream) for _ in range(20)]  # Crosses an epoch boundary (1437 images).
  resumed = dataset.train_batches(batch_size=100, seed=3, start_step=12)
  for expected in from_start[12:]:
    batch = next(resumed)
    np.testing.assert_array_equal(batch['image'], expected['image'])
    np.testing.assert_array_equal(batch['label'], expected['label'])


# ------------------------------------------------------------------------------ image files


@pytest.mark.parametrize('fmt, said', [
    ('PNG', 'Invalid PNG data'),
    ('JPEG', 'Premature end of JPEG data. Stopped at line'),
    ('GIF', 'Invalid GIF data')])
def test_a_cut_image_file_is_one_error_with_what_its_decoder_said(tmp_path, capfd, fmt, said):
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax import errors  # pylint: disable=g-import-not-at-top
  encoded = io.BytesIO()
  Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)).save(
      encoded, format=fmt)
  path = tmp_path / f'cut.{fmt.lower()}'
  path.write_bytes(encoded.getvalue()[:len(encoded.getvalue()) // 2])
  with pytest.raises(errors.BadFileError) as error:
    images.load_files([str(path)])
  assert str(error.value).startswith(
      f'{path} is not an image that can be read (PNG, JPEG, GIF or BMP): {said}'), error.value
  # TensorFlow's C++ log lines (W0000 ... local_rendezvous.cc:412] ...) stay off the screen.
  assert capfd.readouterr().err == ''
