"""Per-example image preprocessing in TensorFlow: channels, crops, resizes, flips, scaling.

Images stay uint8 (H, W, C) until `to_unit_range` turns them into float32 in [-1, 1]. Resizes are
square (aspect ratio is not kept), bilinear with antialiasing. Random functions take a stateless
seed, an int32/int64 tensor of shape (2,): the same seed gives the same output, which is what makes
`ImageDataset.train_batches(seed=...)` reproducible.
"""

import functools

import ml_collections

from vit_jax.data import augment
from vit_jax.data.tf_cpu import tf

TRAIN_CROPS = ('inception_crop', 'resize_random_crop', 'pad_random_crop', 'resize')


def to_uint8(image):
  """Rounds and clips a float image to uint8."""
  return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def _convert_known_channels(image, have: int, channels: int):
  """`to_channels` for an image whose channel count `have` is known in Python."""
  if have in (2, 4):  # Gray + alpha or RGBA: drop the alpha channel.
    image, have = image[..., :have - 1], have - 1
  if have == channels:
    return image
  if channels == 3:  # have == 1
    return tf.tile(image, [1, 1, 3])
  return tf.image.rgb_to_grayscale(image)  # have == 3, channels == 1


def to_channels(image, channels: int):
  """Converts uint8 (H, W, C), C in {1, 2, 3, 4}, to (H, W, channels) for channels in {1, 3}.

  Grayscale is repeated to RGB, alpha is dropped, RGB becomes luma when channels == 1.
  """
  have = image.shape[-1]
  if have is not None:
    return _convert_known_channels(image, have, channels)
  branches = [
      functools.partial(_convert_known_channels, tf.ensure_shape(image, [None, None, c]), c,
                        channels) for c in (1, 2, 3, 4)
  ]
  converted = tf.switch_case(tf.shape(image)[-1] - 1, branches)
  return tf.ensure_shape(converted, [None, None, channels])


def resize(image, size: int):
  """Resizes uint8 (H, W, C) to uint8 (size, size, C); a no-op when the shape already matches."""
  if tuple(image.shape[:2]) == (size, size):
    return image
  resized = tf.image.resize(image, (size, size), method='bilinear', antialias=True)
  return to_uint8(resized)


def inception_crop(image, size: int, seed, min_area: float):
  """Random crop of min_area..100% of the area, aspect ratio 3/4..4/3, resized to (size, size)."""
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image),
      bounding_boxes=tf.zeros([1, 0, 4], tf.float32),  # No boxes: sample from the whole image.
      seed=seed,
      min_object_covered=0.0,
      aspect_ratio_range=(3 / 4, 4 / 3),
      area_range=(min_area, 1.0),
      use_image_if_no_bounding_boxes=True)
  return resize(tf.slice(image, begin, crop_size), size)


def resize_random_crop(image, size: int, seed, resize_ratio: float):
  """Resizes to round(size * resize_ratio) square, then crops a random (size, size) window."""
  image = resize(image, max(size, round(size * resize_ratio)))
  return tf.image.stateless_random_crop(image, [size, size, image.shape[-1]], seed)


def pad_random_crop(image, size: int, seed, padding: int):
  """Resizes to (size, size), zero-pads `padding` pixels per side, crops a random (size, size)."""
  image = resize(image, size)
  padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
  return tf.image.stateless_random_crop(padded, [size, size, image.shape[-1]], seed)


def resize_center_crop(image, size: int, resize_ratio: float):
  """Resizes to round(size * resize_ratio) square, then takes the central (size, size) window."""
  resized_size = max(size, round(size * resize_ratio))
  image = resize(image, resized_size)
  offset = (resized_size - size) // 2
  return image[offset:offset + size, offset:offset + size]


def to_unit_range(image):
  """uint8 image -> float32 in [-1, 1] (0 -> -1, 255 -> 1)."""
  return tf.cast(image, tf.float32) / 127.5 - 1.0


def train_image(image, seed, config: ml_collections.ConfigDict):
  """Training preprocessing of one uint8 image: crop, flip, RandAugment, scale to [-1, 1].

  Returns float32 (image_size, image_size, channels).
  """
  crop_seed, flip_seed, randaugment_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, num=3))
  size = config.image_size
  image = to_channels(image, config.channels)
  if config.train_crop == 'inception_crop':
    image = inception_crop(image, size, crop_seed, config.inception_crop_min_area)
  elif config.train_crop == 'resize_random_crop':
    image = resize_random_crop(image, size, crop_seed, config.resize_ratio)
  elif config.train_crop == 'pad_random_crop':
    image = pad_random_crop(image, size, crop_seed, config.crop_padding)
  elif config.train_crop == 'resize':
    image = resize(image, size)
  else:
    raise ValueError(f'config.train_crop={config.train_crop!r}; expected one of {TRAIN_CROPS}.')
  if config.flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  if config.randaugment_layers > 0 and config.randaugment_magnitude > 0:
    image = augment.randaugment(image, config.randaugment_layers, config.randaugment_magnitude,
                                randaugment_seed, fill=config.randaugment_fill)
  image = tf.ensure_shape(image, [size, size, config.channels])
  return to_unit_range(image)


def eval_image(image, config: ml_collections.ConfigDict):
  """Deterministic preprocessing of one uint8 image: float32 (image_size, image_size, channels)."""
  image = to_channels(image, config.channels)
  image = resize_center_crop(image, config.image_size, config.eval_resize_ratio)
  image = tf.ensure_shape(image, [config.image_size, config.image_size, config.channels])
  return to_unit_range(image)
