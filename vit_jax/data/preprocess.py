"""Image preprocessing in TensorFlow: channels, crops, resizes, flips, scaling to [-1, 1].

Functions work on batches of uint8 images (B, H, W, C) and draw independent randomness for each
example, so a batch of images of one size is preprocessed in a few vectorized ops; images of
varying sizes go through one at a time as batches of one. Resizes are square (the aspect ratio
is not kept), bilinear, antialiased. Random functions take a stateless seed, an int32/int64 tensor
of shape (2,): the same seed gives the same output, which makes training batches reproducible.
"""

import math

import ml_collections

from vit_jax import errors
from vit_jax.data import augment
from vit_jax.data.tf_cpu import tf


def _convert_known_channels(images, have: int, channels: int):
  """`to_channels` for images whose channel count `have` is known in Python."""
  if have in (2, 4):  # Gray + alpha or RGBA: drop the alpha channel.
    images, have = images[..., :have - 1], have - 1
  if have == channels:
    return images
  if channels == 3:  # have == 1
    return tf.concat([images] * 3, axis=-1)
  return tf.image.rgb_to_grayscale(images)  # have == 3, channels == 1


def to_channels(images, channels: int):
  """Converts uint8 (..., C), C in {1, 2, 3, 4}, to (..., channels) for channels in {1, 3}.

  Grayscale is repeated to RGB, alpha is dropped, RGB becomes luma when channels == 1.
  """
  have = images.shape[-1]
  if have is not None:
    return _convert_known_channels(images, have, channels)

  def branch(c):
    return lambda: _convert_known_channels(
        tf.ensure_shape(images, images.shape[:-1].concatenate([c])), c, channels)

  converted = tf.switch_case(tf.shape(images)[-1] - 1, [branch(c) for c in (1, 2, 3, 4)])
  return tf.ensure_shape(converted, images.shape[:-1].concatenate([channels]))


def resize(images, size: int):
  """Resizes uint8 (..., H, W, C) to (..., size, size, C); a no-op when the size already matches."""
  if tuple(images.shape[-3:-1]) == (size, size):
    return images
  return augment.to_uint8(tf.image.resize(images, (size, size), method='bilinear', antialias=True))


def _uniform(shape, seed):
  return tf.random.stateless_uniform(shape, seed, dtype=tf.float32)


def random_crop(images, size: int, seed):
  """A random (size, size) window of each uint8 image in (B, H, W, C); needs H, W >= size."""
  batch, height, width = tf.unstack(tf.shape(images)[:3])
  offsets = _uniform([batch, 2], seed) * tf.cast([height - size + 1, width - size + 1], tf.float32)
  offsets = tf.cast(tf.floor(offsets), tf.int32)  # (B, 2): top, left.
  rows = offsets[:, :1] + tf.range(size)[None]  # (B, size)
  cols = offsets[:, 1:] + tf.range(size)[None]
  images = tf.gather(images, rows, axis=1, batch_dims=1)  # (B, size, W, C)
  return tf.gather(images, cols, axis=2, batch_dims=1)  # (B, size, size, C)


def inception_crop(images, size: int, seed, min_area: float, flip_seed=None):
  """Random-resized crop: a window per image, resized to (size, size).

  The window covers a uniform min_area..1 fraction of the image area with an aspect ratio
  log-uniform in 3/4..4/3; a side that would exceed the image is clipped to it. With
  `flip_seed`, crops are mirrored as `random_flip(crops, flip_seed)` would, for free: the
  window is sampled from right to left.
  """
  batch, height, width = tf.unstack(tf.cast(tf.shape(images)[:3], tf.float32))
  draws = _uniform([tf.cast(batch, tf.int32), 4], seed)  # (B, 4)
  area = min_area + (1.0 - min_area) * draws[:, 0]
  aspect = tf.exp(math.log(3 / 4) + math.log(16 / 9) * draws[:, 1])  # Window width / height.
  # As fractions of the image sides: box_h * box_w = area, (box_w * W) / (box_h * H) = aspect.
  box_h = tf.minimum(tf.sqrt(area / aspect * width / height), 1.0)
  box_w = tf.minimum(tf.sqrt(area * aspect * height / width), 1.0)
  top = draws[:, 2] * (1.0 - box_h)
  left = draws[:, 3] * (1.0 - box_w)
  right = left + box_w
  if flip_seed is not None:
    flip = _flips(tf.shape(images)[0], flip_seed)
    left, right = tf.where(flip, right, left), tf.where(flip, left, right)
  boxes = tf.stack([top, left, top + box_h, right], axis=1)  # (B, 4) normalized y/x.
  crops = tf.image.crop_and_resize(tf.cast(images, tf.float32), boxes,
                                   tf.range(tf.shape(images)[0]), [size, size])
  return augment.to_uint8(crops)


def _flips(batch, seed):
  """(B,) bool: which images of a batch to mirror."""
  return _uniform([batch], seed) < 0.5


def random_flip(images, seed):
  """Mirrors each image of (B, H, W, C) left-right with probability 1/2."""
  flip = _flips(tf.shape(images)[0], seed)
  return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


def resize_center_crop(images, size: int, resize_ratio: float):
  """Resizes to round(size * resize_ratio) square, then takes the central (size, size) window."""
  resized_size = max(size, round(size * resize_ratio))
  images = resize(images, resized_size)
  offset = (resized_size - size) // 2
  return images[..., offset:offset + size, offset:offset + size, :]


def to_unit_range(images):
  """uint8 images -> float32 in [-1, 1] (0 -> -1, 255 -> 1)."""
  return tf.cast(images, tf.float32) / 127.5 - 1.0


def train_images(images, seed, config: ml_collections.ConfigDict):
  """Training preprocessing: channels, crop, flip, RandAugment, scaling to [-1, 1].

  Args:
    images: uint8 (B, H, W, C) with C in {1, 2, 3, 4}.
    seed: stateless seed, int32/int64 (2,); every example gets its own randomness from it.
    config: the data config (see images.default_config).

  Returns:
    float32 (B, image_size, image_size, channels).
  """
  crop_seed, flip_seed, randaugment_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, num=3))
  size = config.image_size
  images = to_channels(images, config.channels)
  flip_in_crop = config.flip and config.train_crop == 'inception_crop'
  if config.train_crop == 'inception_crop':
    images = inception_crop(images, size, crop_seed, config.inception_crop_min_area,
                            flip_seed if flip_in_crop else None)
  elif config.train_crop == 'resize_random_crop':
    images = resize(images, max(size, round(size * config.resize_ratio)))
    images = random_crop(images, size, crop_seed)
  elif config.train_crop == 'pad_random_crop':
    padding = config.crop_padding
    images = tf.pad(resize(images, size), [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    images = random_crop(images, size, crop_seed)
  elif config.train_crop == 'resize':
    images = resize(images, size)
  else:
    raise errors.ConfigError(f'config.train_crop={config.train_crop!r} is not a known train crop.')
  images = tf.ensure_shape(images, [None, size, size, config.channels])
  if config.flip and not flip_in_crop:
    images = random_flip(images, flip_seed)
  if config.randaugment_layers > 0 and config.randaugment_magnitude > 0:
    example_seeds = tf.random.experimental.stateless_split(
        randaugment_seed, num=tf.shape(images)[0])  # (B, 2)

    def randaugment_one(image_and_seed):
      image, example_seed = image_and_seed
      return augment.randaugment(image, config.randaugment_layers, config.randaugment_magnitude,
                                 example_seed, fill=config.randaugment_fill)

    images = tf.map_fn(randaugment_one, (images, example_seeds), fn_output_signature=tf.uint8)
  return to_unit_range(images)


def eval_images(images, config: ml_collections.ConfigDict):
  """Deterministic preprocessing of uint8 (..., H, W, C) images: channels, resize (+ center crop).

  Returns float32 (..., image_size, image_size, channels) in [-1, 1].
  """
  images = to_channels(images, config.channels)
  images = resize_center_crop(images, config.image_size, config.eval_resize_ratio)
  size = config.image_size
  images = tf.ensure_shape(images, images.shape[:-3].concatenate([size, size, config.channels]))
  return to_unit_range(images)
