"""Random erasing (Zhong et al., 2020) of normalized training images, in TensorFlow ops.

As timm's `RandomErasing(probability, mode='pixel')`, which DeiT trains with (probability
0.25): each image, with the given probability, gets one rectangle of independent N(0, 1)
noise per pixel and channel (noise in normalized units, so the rectangle looks like no
image). The rectangle covers a uniform 2% to 1/3 of the image's area, with a log-uniform
aspect ratio (height / width) in [0.3, 1 / 0.3], at a uniform position; of 10 tries, the first
that fits inside the image (height and width both smaller than the image's) is taken, and
none erases nothing.
"""

import math

from vit_jax.data.tf_cpu import tf

MIN_AREA, MAX_AREA = 0.02, 1 / 3
MIN_ASPECT = 0.3
ATTEMPTS = 10


def _rectangles(batch, height, width, probability: float, seed):
  """int32 (B,) each of top, left, rectangle height and width; 0 by 0 for images not erased."""
  choice_seed, shape_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  erased = tf.random.stateless_uniform([batch], choice_seed) < probability
  # (B, ATTEMPTS, 4): area share, log aspect ratio, top and left as fractions of their ranges.
  draws = tf.random.stateless_uniform([batch, ATTEMPTS, 4], shape_seed)
  area = (MIN_AREA + (MAX_AREA - MIN_AREA) * draws[..., 0]) * tf.cast(height * width, tf.float32)
  log_aspect = math.log(MIN_ASPECT) + 2 * math.log(1 / MIN_ASPECT) * draws[..., 1]
  sides = tf.sqrt(area[..., None] * tf.exp(tf.stack([log_aspect, -log_aspect], axis=-1)))
  sides = tf.cast(tf.round(sides), tf.int32)  # (B, ATTEMPTS, 2): height, width
  fits = (sides[..., 0] < height) & (sides[..., 1] < width)
  first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)  # 0 if none fits
  take = tf.stack([tf.range(batch), first], axis=1)
  erased &= tf.gather_nd(fits, take)
  rows, cols = tf.unstack(tf.gather_nd(sides, take) * tf.cast(erased, tf.int32)[:, None], axis=1)
  fractions = tf.gather_nd(draws, take)  # (B, 4)
  # Uniform integers in [0, side - rows] and [0, side - cols], as random.randint.
  top = tf.cast(fractions[:, 2] * tf.cast(height - rows + 1, tf.float32), tf.int32)
  left = tf.cast(fractions[:, 3] * tf.cast(width - cols + 1, tf.float32), tf.int32)
  return top, left, rows, cols


def random_erasing(images, probability: float, seed):
  """float32 (B, H, W, C) normalized images -> the same with their rectangles erased.

  Args:
    images: float32 (B, H, W, C), normalized.
    probability: the share of images that get a rectangle, in [0, 1].
    seed: stateless seed, int32/int64 (2,).
  """
  shape = tf.shape(images)
  batch, height, width, channels = shape[0], shape[1], shape[2], shape[3]
  box_seed, noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  top, left, rows, cols = (x[:, None, None] for x in _rectangles(batch, height, width,
                                                                 probability, box_seed))
  row, col = tf.range(height)[None, :, None], tf.range(width)[None, None, :]
  inside = ((row >= top) & (row < top + rows) & (col >= left) & (col < left + cols))  # (B, H, W)
  pixels = tf.where(inside)  # (erased pixels, 3): batch, row, column
  # Noise for the erased pixels only.
  noise = tf.random.stateless_normal([tf.shape(pixels)[0], channels], noise_seed)
  return tf.tensor_scatter_nd_update(images, pixels, noise)
