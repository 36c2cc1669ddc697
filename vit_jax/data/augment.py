"""RandAugment in TensorFlow ops (mixup and CutMix: `mixing`).

RandAugment (Cubuk et al., 2019): each image gets `num_layers` ops drawn uniformly from
`RANDAUGMENT_OPS`, each at the same fixed magnitude. Ops work on uint8 (H, W, C) images,
C in {1, 3}.
Magnitude is on the paper's 0..10 scale (10 = the strengths below); larger values, as some recipes
use (up to 30 here), extrapolate linearly and are clipped to each op's valid range:
  rotate +-30 degrees, shear +-0.3, translate +-30% of the side, brightness / contrast / color /
  sharpness factor 1 +- 0.9, solarize threshold 256 -> 0, posterize 8 -> 4 bits;
  identity, autocontrast and equalize have no magnitude.
Signed ops pick the sign at random. Geometric ops fill uncovered pixels with `fill`.
"""

import functools
import math

from vit_jax.data.tf_cpu import tf


def to_uint8(images):
  """Rounds and clips float images to uint8."""
  return tf.cast(tf.clip_by_value(tf.round(images), 0.0, 255.0), tf.uint8)


def _blend(degenerate, image, factor):
  """degenerate + factor * (image - degenerate) as uint8: 0 gives `degenerate`, 1 gives `image`."""
  degenerate = tf.cast(degenerate, tf.float32)
  return to_uint8(degenerate + factor * (tf.cast(image, tf.float32) - degenerate))


def _luma(image):
  """float32 (H, W, 1) grayscale of a uint8 (H, W, C) image."""
  image = tf.cast(image, tf.float32)
  return image if image.shape[-1] == 1 else tf.image.rgb_to_grayscale(image)


def brightness(image, factor):
  """Scales pixel values by `factor` (0 gives black)."""
  return _blend(tf.zeros_like(image), image, factor)


def contrast(image, factor):
  """Moves pixels away from (factor > 1) or towards (factor < 1) the mean gray level."""
  mean = tf.reduce_mean(_luma(image))
  return _blend(tf.fill(tf.shape(image), mean), image, factor)


def color(image, factor):
  """Changes saturation: 0 gives grayscale, 1 the image; a no-op on 1-channel images."""
  if image.shape[-1] == 1:
    return image
  gray = tf.tile(_luma(image), [1, 1, 3])
  return _blend(gray, image, factor)


def sharpness(image, factor):
  """Blends with a 3x3-smoothed copy (factor < 1 blurs, > 1 sharpens); border pixels are kept."""
  channels = image.shape[-1]
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, channels, 1])  # (3, 3, C, 1)
  batch = tf.cast(image, tf.float32)[None]  # (1, H, W, C)
  smooth = tf.nn.depthwise_conv2d(batch, kernel, strides=[1, 1, 1, 1], padding='SAME')[0]
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  rows, cols = tf.range(height)[:, None, None], tf.range(width)[None, :, None]
  interior = (rows > 0) & (rows < height - 1) & (cols > 0) & (cols < width - 1)  # (H, W, 1)
  degenerate = tf.where(interior, tf.round(smooth), tf.cast(image, tf.float32))
  return _blend(degenerate, image, factor)


def solarize(image, threshold):
  """Inverts pixels >= threshold (threshold 256 is a no-op, 0 inverts everything)."""
  values = tf.cast(image, tf.int32)
  return tf.cast(tf.where(values < tf.cast(threshold, tf.int32), values, 255 - values), tf.uint8)


def posterize(image, bits):
  """Keeps the `bits` most significant bits of each pixel."""
  shift = tf.cast(8 - bits, tf.uint8)
  return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def autocontrast(image):
  """Stretches each channel linearly so that its darkest pixel is 0 and its brightest 255."""
  values = tf.cast(image, tf.float32)
  low = tf.reduce_min(values, axis=[0, 1])  # (C,)
  high = tf.reduce_max(values, axis=[0, 1])
  scale = tf.math.divide_no_nan(255.0, high - low)
  stretched = tf.where(high > low, (values - low) * scale, values)
  return to_uint8(stretched)


def _equalize_channel(channel):
  """Histogram equalization of a uint8 (H, W) channel.

  The PIL.ImageOps.equalize recipe, with a fractional step so that images with fewer than 256
  pixels (PIL leaves those unchanged) are equalized too.
  """
  values = tf.cast(channel, tf.int32)
  histogram = tf.math.bincount(values, minlength=256, maxlength=256)  # (256,)
  used_bins = tf.boolean_mask(histogram, histogram > 0)
  # Pixels per output level, leaving out the brightest used bin (it maps to 255).
  step = tf.cast(tf.reduce_sum(used_bins) - used_bins[-1], tf.float32) / 255.0
  below = tf.cast(tf.cumsum(histogram, exclusive=True), tf.float32)  # Pixels darker than each bin.
  lookup = tf.floor((below + step / 2.0) / tf.maximum(step, 1e-6))
  equalized = tf.gather(tf.cast(tf.clip_by_value(lookup, 0.0, 255.0), tf.int32), values)
  return tf.cast(tf.where(step > 0, equalized, values), tf.uint8)  # One gray level: unchanged.


def equalize(image):
  """Equalizes the histogram of each channel separately."""
  return tf.stack([_equalize_channel(image[:, :, c]) for c in range(image.shape[-1])], axis=-1)


def _transform(image, transform, fill):
  """Projective transform; `transform` maps output (x, y) to input coordinates (8 numbers)."""
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=tf.cast(image, tf.float32)[None],
      transforms=tf.cast(tf.stack(transform), tf.float32)[None],
      output_shape=tf.shape(image)[:2],
      fill_value=tf.cast(fill, tf.float32),
      interpolation='BILINEAR',
      fill_mode='CONSTANT')
  return to_uint8(out[0])


def rotate(image, degrees, fill=128):
  """Rotates counterclockwise by `degrees` about the image center."""
  radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(radians), tf.sin(radians)
  center_y = (tf.cast(tf.shape(image)[0], tf.float32) - 1.0) / 2.0
  center_x = (tf.cast(tf.shape(image)[1], tf.float32) - 1.0) / 2.0
  # Input point = inverse rotation of the output point about the center.
  return _transform(image, [
      cos, -sin, center_x - cos * center_x + sin * center_y,
      sin, cos, center_y - sin * center_x - cos * center_y,
      0.0, 0.0
  ], fill)


def shear_x(image, shear, fill=128):
  """Shifts row y right by -shear * y pixels (output (x, y) reads input (x + shear * y, y))."""
  return _transform(image, [1.0, shear, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], fill)


def shear_y(image, shear, fill=128):
  """Shifts column x by -shear * x pixels (output (x, y) reads input (x, y + shear * x))."""
  return _transform(image, [1.0, 0.0, 0.0, shear, 1.0, 0.0, 0.0, 0.0], fill)


def translate_x(image, pixels, fill=128):
  """Moves the content right by `pixels`."""
  return _transform(image, [1.0, 0.0, -pixels, 0.0, 1.0, 0.0, 0.0, 0.0], fill)


def translate_y(image, pixels, fill=128):
  """Moves the content down by `pixels`."""
  return _transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, -pixels, 0.0, 0.0], fill)


def _factor(level, sign):
  return tf.maximum(1.0 + sign * 0.9 * level, 0.0)


def _side(image, axis):
  return tf.cast(tf.shape(image)[axis], tf.float32)


# name -> fn(image uint8 (H, W, C), level = magnitude / 10, sign in {-1., 1.}, fill) -> same shape.
RANDAUGMENT_OPS = {
    'identity': lambda image, level, sign, fill: image,
    'autocontrast': lambda image, level, sign, fill: autocontrast(image),
    'equalize': lambda image, level, sign, fill: equalize(image),
    'rotate': lambda image, level, sign, fill: rotate(image, sign * 30.0 * level, fill),
    'solarize': lambda image, level, sign, fill: solarize(
        image, tf.clip_by_value(256.0 - 256.0 * level, 0.0, 256.0)),
    'posterize': lambda image, level, sign, fill: posterize(
        image, tf.clip_by_value(8 - tf.cast(tf.round(4.0 * level), tf.int32), 1, 8)),
    'color': lambda image, level, sign, fill: color(image, _factor(level, sign)),
    'contrast': lambda image, level, sign, fill: contrast(image, _factor(level, sign)),
    'brightness': lambda image, level, sign, fill: brightness(image, _factor(level, sign)),
    'sharpness': lambda image, level, sign, fill: sharpness(image, _factor(level, sign)),
    'shear_x': lambda image, level, sign, fill: shear_x(image, sign * 0.3 * level, fill),
    'shear_y': lambda image, level, sign, fill: shear_y(image, sign * 0.3 * level, fill),
    'translate_x': lambda image, level, sign, fill: translate_x(
        image, sign * 0.3 * level * _side(image, 1), fill),
    'translate_y': lambda image, level, sign, fill: translate_y(
        image, sign * 0.3 * level * _side(image, 0), fill),
}


def randaugment(image, num_layers: int, magnitude: float, seed, fill: int = 128):
  """Applies `num_layers` ops drawn uniformly from RANDAUGMENT_OPS at `magnitude` (0..30).

  Args:
    image: uint8 (H, W, C), C in {1, 3}, static C.
    num_layers: how many ops to apply in sequence.
    magnitude: strength on the RandAugment 0..10 scale (see the module docstring).
    seed: stateless seed, int32/int64 (2,).
    fill: gray level for pixels that geometric ops uncover.

  Returns:
    uint8 image of the input's shape.
  """
  ops = list(RANDAUGMENT_OPS.values())
  level = float(magnitude) / 10.0
  for layer_seed in tf.unstack(tf.random.experimental.stateless_split(seed, num=num_layers)):
    op_seed, sign_seed = tf.unstack(tf.random.experimental.stateless_split(layer_seed, num=2))
    op_index = tf.random.stateless_uniform([], op_seed, minval=0, maxval=len(ops), dtype=tf.int32)
    sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)
    branches = [functools.partial(op, image, level, sign, fill) for op in ops]
    image = tf.ensure_shape(tf.switch_case(op_index, branches), image.shape)
  return image
