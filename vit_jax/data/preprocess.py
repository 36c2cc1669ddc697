"""Image preprocessing in TensorFlow: channels, crops, resizes, flips, normalization.

Functions work on batches of uint8 images (B, H, W, C) and draw independent randomness for each
example, so a batch of images of one size is preprocessed in a few vectorized ops; images of
varying sizes go through one at a time as batches of one. Resizes are antialiased, bilinear
or bicubic, except the inception crop's bilinear sampling (`inception_crop`); square (the
aspect ratio not kept) except the eval resize `shorter_side`. Random functions take a
stateless seed, an int32/int64 tensor of shape (2,): the same seed gives the same output,
which makes training batches reproducible.
"""

import math

import ml_collections

from vit_jax import errors
from vit_jax.data import augment, normalization
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


def resize(images, size: int, method: str = 'bilinear'):
  """Resizes uint8 (..., H, W, C) to (..., size, size, C); a no-op when the size already matches.

  `method`: 'bilinear' or 'bicubic' (Keys' kernel, a = -0.5, as PIL's), both antialiased.
  """
  if tuple(images.shape[-3:-1]) == (size, size):
    return images
  return augment.to_uint8(tf.image.resize(images, (size, size), method=method, antialias=True))


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


def _inception_boxes(batch, height, width, seed, min_area: float, flip_seed):
  """(B, 4) crop_and_resize boxes (y1, x1, y2, x2 normalized) of `inception_crop`."""
  draws = _uniform([batch, 4], seed)  # (B, 4)
  area = min_area + (1.0 - min_area) * draws[:, 0]
  aspect = tf.exp(math.log(3 / 4) + math.log(16 / 9) * draws[:, 1])  # Window width / height.
  # As fractions of the image sides: box_h * box_w = area, (box_w * W) / (box_h * H) = aspect.
  box_h = tf.minimum(tf.sqrt(area / aspect * width / height), 1.0)
  box_w = tf.minimum(tf.sqrt(area * aspect * height / width), 1.0)
  top = draws[:, 2] * (1.0 - box_h)
  left = draws[:, 3] * (1.0 - box_w)
  right = left + box_w
  if flip_seed is not None:
    flip = _flips(batch, flip_seed)
    left, right = tf.where(flip, right, left), tf.where(flip, left, right)
  return tf.stack([top, left, top + box_h, right], axis=1)


def inception_crop(images, size: int, seed, min_area: float, flip_seed=None,
                   interpolation: str = 'bilinear'):
  """Random-resized crop: a window per image, resized to (size, size).

  The window covers a uniform min_area..1 fraction of the image area with an aspect ratio
  log-uniform in 3/4..4/3; a side that would exceed the image is clipped to it. With
  `flip_seed`, crops are mirrored as `random_flip(crops, flip_seed)` would, for free: the
  window is sampled from right to left. `interpolation` 'bilinear' samples the window
  bilinearly (`crop_and_resize`, not antialiased, as Google's ViT and big_vision); 'bicubic'
  cuts the window to whole pixels and resizes it antialiased (as timm's and DeiT's PIL crop).
  """
  # A static batch where there is one (one image of a folder): TensorFlow's graph optimizer
  # then knows the boxes' count, and does not log a warning that it cannot cost the crop.
  batch = images.shape[0] if images.shape[0] is not None else tf.shape(images)[0]
  height, width = tf.unstack(tf.cast(tf.shape(images)[1:3], tf.float32))
  boxes = _inception_boxes(batch, height, width, seed, min_area, flip_seed)
  if interpolation == 'bicubic':
    def crop_one(image_and_box):
      image, box = image_and_box
      top, left, rows, cols, flip = _pixel_box(box, tf.shape(image)[0], tf.shape(image)[1])
      return _resized_window(image[top:top + rows, left:left + cols], size, flip)
    return tf.map_fn(crop_one, (images, boxes), fn_output_signature=tf.uint8)
  crops = tf.image.crop_and_resize(tf.cast(images, tf.float32), boxes, tf.range(batch),
                                   [size, size])
  return augment.to_uint8(crops)


def _pixel_box(box, height, width):
  """A crop_and_resize box (y1, x1, y2, x2; x1 > x2 mirrors) as whole pixels of the image:
  (top, left, rows, cols, flip), each side at least one pixel."""
  def side(start, stop, pixels):
    pixels_f = tf.cast(pixels, tf.float32)
    count = tf.clip_by_value(tf.cast(tf.round(tf.abs(stop - start) * pixels_f), tf.int32),
                             1, pixels)
    first = tf.cast(tf.round(tf.minimum(start, stop) * pixels_f), tf.int32)
    return tf.clip_by_value(first, 0, pixels - count), count
  top, rows = side(box[0], box[2], height)
  left, cols = side(box[1], box[3], width)
  return top, left, rows, cols, box[1] > box[3]


def _resized_window(window, size: int, flip):
  """uint8 (H, W, C) window -> (size, size, C), bicubic and antialiased, mirrored if `flip`."""
  crop = augment.to_uint8(tf.image.resize(window, (size, size), method='bicubic',
                                          antialias=True))
  return tf.cond(flip, lambda: tf.reverse(crop, axis=[1]), lambda: crop)


def _pixel_window(start, stop, side):
  """First pixel and pixel count covering the normalized span start..stop of `side` pixels.

  Also returns the span in the window's own normalized coordinates. crop_and_resize samples
  at start * (side - 1) .. stop * (side - 1) and reads the pixels on both sides of each point.
  """
  last = tf.cast(side - 1, tf.float32)
  low, high = tf.minimum(start, stop) * last, tf.maximum(start, stop) * last
  first = tf.cast(tf.floor(low), tf.int32)
  end = tf.minimum(tf.cast(tf.math.ceil(high), tf.int32), side - 1)
  first = tf.maximum(tf.minimum(first, end - 1), 0)  # At least 2 pixels where the side has them.
  count = end - first + 1
  span = tf.cast(tf.maximum(count - 1, 1), tf.float32)
  first_f = tf.cast(first, tf.float32)
  return first, count, (start * last - first_f) / span, (stop * last - first_f) / span


def inception_crop_encoded(encoded, size: int, seed, min_area: float, channels: int,
                           flip_seed=None, interpolation: str = 'bilinear'):
  """`inception_crop` of one encoded image (bytes) -> uint8 (1, size, size, channels).

  A JPEG decodes only the window's pixels (`decode_and_crop_jpeg`): the same window and
  sampling, pixels within a few levels of a full decode at the window's edges. Other formats
  are decoded whole.
  """
  def jpeg():
    shape = tf.io.extract_jpeg_shape(encoded)
    height, width = shape[0], shape[1]
    box = _inception_boxes(1, tf.cast(height, tf.float32), tf.cast(width, tf.float32), seed,
                           min_area, flip_seed)[0]
    if interpolation == 'bicubic':
      top, left, rows, cols, flip = _pixel_box(box, height, width)
      # Decoded with a margin of a JPEG block (16 pixels where chroma is halved): a window's
      # edge pixels decode a little differently from a full decode's, and these are the crop's.
      first_row, first_col = tf.maximum(top - 16, 0), tf.maximum(left - 16, 0)
      last_row = tf.minimum(top + rows + 16, height)
      last_col = tf.minimum(left + cols + 16, width)
      window = tf.image.decode_and_crop_jpeg(
          encoded, tf.stack([first_row, first_col, last_row - first_row, last_col - first_col]),
          channels=channels)
      window = window[top - first_row:top - first_row + rows,
                      left - first_col:left - first_col + cols]
      return _resized_window(window, size, flip)[None]
    top, rows, y1, y2 = _pixel_window(box[0], box[2], height)
    left, cols, x1, x2 = _pixel_window(box[1], box[3], width)
    window = tf.image.decode_and_crop_jpeg(encoded, tf.stack([top, left, rows, cols]),
                                           channels=channels)
    crops = tf.image.crop_and_resize(tf.cast(window, tf.float32)[None],
                                     tf.stack([y1, x1, y2, x2])[None], [0], [size, size])
    return augment.to_uint8(crops)

  def other():
    image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    return inception_crop(image[None], size, seed, min_area, flip_seed, interpolation)

  crops = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
  return tf.ensure_shape(crops, [1, size, size, channels])


def _flips(batch, seed):
  """(B,) bool: which images of a batch to mirror."""
  return _uniform([batch], seed) < 0.5


def random_flip(images, seed):
  """Mirrors each image of (B, H, W, C) left-right with probability 1/2."""
  flip = _flips(tf.shape(images)[0], seed)
  return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


def resize_shorter_side(images, size: int, method: str = 'bilinear'):
  """Resizes uint8 (..., H, W, C) to a shorter side of `size`, keeping the aspect ratio.

  The longer side becomes floor(size * longer / shorter), as torchvision's Resize(size).
  """
  height, width = tf.unstack(tf.shape(images)[-3:-1])
  shorter = tf.minimum(height, width)
  resized = tf.stack([size * height // shorter, size * width // shorter])
  return augment.to_uint8(tf.image.resize(images, resized, method=method, antialias=True))


def resize_center_crop(images, size: int, resize_ratio: float, how: str = 'square',
                       method: str = 'bilinear'):
  """Resizes to round(size * resize_ratio), then takes the central (size, size) window.

  `how`: 'square' resizes both sides to it; 'shorter_side' the shorter one, keeping the
  aspect ratio (the window's offsets round down). `method`: as `resize`'s.
  """
  resized_size = max(size, round(size * resize_ratio))
  if how == 'square':
    images = resize(images, resized_size, method)
    top = left = (resized_size - size) // 2
  elif how == 'shorter_side':
    images = resize_shorter_side(images, resized_size, method)
    height, width = tf.unstack(tf.shape(images)[-3:-1])
    top, left = (height - size) // 2, (width - size) // 2
  else:
    raise ValueError(f'Eval resize {how!r} is neither square nor shorter_side.')
  return images[..., top:top + size, left:left + size, :]


def normalize(images, config: ml_collections.ConfigDict):
  """uint8 images (..., C) -> float32 (p / 255 - config.pixel_mean) / config.pixel_std."""
  scale, offset = normalization.of_config(config)
  return tf.cast(images, tf.float32) * scale + offset


def _crop(images, seed, flip_seed, config: ml_collections.ConfigDict):
  """config.train_crop of uint8 (B, H, W, C) -> (B, image_size, image_size, C)."""
  size, method = config.image_size, config.train_interpolation
  if config.train_crop == 'inception_crop':
    return inception_crop(images, size, seed, config.inception_crop_min_area, flip_seed, method)
  if config.train_crop == 'resize_random_crop':
    resized = resize(images, max(size, round(size * config.resize_ratio)), method)
    return random_crop(resized, size, seed)
  if config.train_crop == 'pad_random_crop':
    padding = config.crop_padding
    images = tf.pad(resize(images, size, method),
                    [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    return random_crop(images, size, seed)
  if config.train_crop == 'resize':
    return resize(images, size, method)
  raise errors.ConfigError(f'config.train_crop={config.train_crop!r} is not a known train crop.')


def _train_seeds(seed):
  """(crop, flip, RandAugment) seeds of one stateless seed."""
  return tf.unstack(tf.random.experimental.stateless_split(seed, num=3))


def train_crops(images, seed, config: ml_collections.ConfigDict, encoded=False):
  """The first half of `train_images`: channels, crop and flip, to uint8 crops.

  With `encoded`, `images` is one encoded image (a scalar string: JPEG, PNG, ...) for the
  inception crop, which decodes it (a JPEG only within the crop's window).
  """
  crop_seed, flip_seed, _ = _train_seeds(seed)
  size = config.image_size
  flip_in_crop = config.flip and config.train_crop == 'inception_crop'
  crop_flip_seed = flip_seed if flip_in_crop else None
  if encoded:
    if config.train_crop != 'inception_crop':
      raise ValueError(f'Encoded images take the inception crop, not {config.train_crop!r}.')
    images = inception_crop_encoded(images, size, crop_seed, config.inception_crop_min_area,
                                    config.channels, crop_flip_seed, config.train_interpolation)
  else:
    images = _crop(to_channels(images, config.channels), crop_seed, crop_flip_seed, config)
  images = tf.ensure_shape(images, [None, size, size, config.channels])
  if config.flip and not flip_in_crop:
    images = random_flip(images, flip_seed)
  return images


def randaugment_images(crops, seed, config: ml_collections.ConfigDict):
  """The second half of `train_images`: RandAugment of uint8 crops (B, S, S, C), if enabled."""
  _, _, randaugment_seed = _train_seeds(seed)
  if not (config.randaugment_layers > 0 and config.randaugment_magnitude > 0):
    return crops
  example_seeds = tf.random.experimental.stateless_split(
      randaugment_seed, num=tf.shape(crops)[0])  # (B, 2)

  def randaugment_one(image, example_seed):
    return augment.randaugment(image, config.randaugment_layers, config.randaugment_magnitude,
                               example_seed, fill=config.randaugment_fill)

  if crops.shape[0] == 1:  # One image (the per-example pipeline): no loop.
    return randaugment_one(crops[0], example_seeds[0])[None]
  return tf.map_fn(lambda pair: randaugment_one(*pair), (crops, example_seeds),
                   fn_output_signature=tf.uint8)


def train_images(images, seed, config: ml_collections.ConfigDict):
  """Training preprocessing: channels, crop, flip, RandAugment, normalization.

  Args:
    images: uint8 (B, H, W, C) with C in {1, 2, 3, 4}.
    seed: stateless seed, int32/int64 (2,); every example gets its own randomness from it.
    config: the data config (see images.default_config).

  Returns:
    float32 (B, image_size, image_size, channels).
  """
  return normalize(randaugment_images(train_crops(images, seed, config), seed, config), config)


def eval_images(images, config: ml_collections.ConfigDict):
  """Deterministic preprocessing of uint8 (..., H, W, C) images: channels, resize (+ center crop).

  Returns float32 (..., image_size, image_size, channels), normalized (`normalize`).
  """
  images = to_channels(images, config.channels)
  images = resize_center_crop(images, config.image_size, config.eval_resize_ratio,
                              config.eval_resize, config.eval_interpolation)
  size = config.image_size
  images = tf.ensure_shape(images, images.shape[:-3].concatenate([size, size, config.channels]))
  return normalize(images, config)
