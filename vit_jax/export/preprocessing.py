"""The eval pipeline's preprocessing (`vit_jax.data.preprocess.eval_images`) in jnp.

Exported models with `--preprocess` take uint8 (B, H, W, C) images of any size: an antialiased
bilinear or bicubic resize (TF's `resize(..., antialias=True)`: ScaleAndTranslate's triangle
or Keys cubic kernel) to round(image_size * eval_resize_ratio), square or of the shorter side,
rounding to uint8,
the central (image_size, image_size) crop, and normalization: pixel * scale + offset per
channel, which is (pixel / 255 - mean) / std (`vit_jax.data.normalization.affine`). H and W
may be symbolic: only the crop's pixels are computed, so no shape depends on H and W's values.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _triangle(x: jax.Array) -> jax.Array:
  return jnp.maximum(0.0, 1.0 - x)


def _keys_cubic(x: jax.Array) -> jax.Array:
  """Keys' cubic convolution kernel with a = -0.5 (TF's 'keyscubic', PIL's bicubic)."""
  a = -0.5
  near = ((a + 2) * x - (a + 3)) * x * x + 1  # |x| <= 1
  far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # 1 < |x| < 2
  return jnp.where(x <= 1, near, jnp.where(x < 2, far, 0.0))


KERNELS = {'bilinear': _triangle, 'bicubic': _keys_cubic}


def window_weights(pixels: jax.Array, resized: jax.Array, start: jax.Array, size: int,
                   interpolation: str = 'bilinear') -> jax.Array:
  """(size, in) float32 weights of pixels start..start + size of an antialiased resize of
  `in` pixels to `resized` along one axis.

  `pixels` is any (in,) vector along the axis (its length may be a symbolic dimension: the
  pixel indices are counted from it, which ONNX converters follow); `resized` and `start` are
  float32 scalars. Output pixel o samples the input at (o + 0.5) * in / resized; input pixel i
  weighs kernel(|i + 0.5 - sample| / k), k = max(in / resized, 1), normalized to sum to 1.
  """
  ones = jnp.ones_like(pixels, dtype=jnp.float32)
  inverse_scale = jnp.sum(ones) / resized
  kernel_scale = jnp.maximum(inverse_scale, 1.0)
  samples = (start + jnp.arange(size, dtype=jnp.float32) + 0.5) * inverse_scale
  centers = jnp.cumsum(ones) - 0.5  # i + 0.5
  distances = jnp.abs(centers[None] - samples[:, None]) / kernel_scale  # (size, in)
  weights = KERNELS[interpolation](distances)
  # Positive where a sample lies on the image (its nearest pixel outweighs the cubic's negative
  # lobes); > rather than !=, which jax2onnx's ONNX leaves untyped.
  total = jnp.sum(weights, axis=1, keepdims=True)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)


def _resized_sides(rows: jax.Array, cols: jax.Array, resized_size: int, how: str):
  """(resized height, resized width) as float32 scalars, for images of len(rows) x len(cols)."""
  if how == 'square':
    return jnp.float32(resized_size), jnp.float32(resized_size)
  if how == 'shorter_side':
    height = jnp.sum(jnp.ones_like(rows, dtype=jnp.float32))
    width = jnp.sum(jnp.ones_like(cols, dtype=jnp.float32))
    shorter = jnp.minimum(height, width)
    # floor(size * side / shorter), as the TF pipeline's integer division.
    return (jnp.floor(resized_size * height / shorter),
            jnp.floor(resized_size * width / shorter))
  raise ValueError(f'Eval resize {how!r} is neither square nor shorter_side.')


def eval_images(images: jax.Array, image_size: int, resize_ratio: float, scale: np.ndarray,
                offset: np.ndarray, how: str = 'square',
                interpolation: str = 'bilinear') -> jax.Array:
  """uint8 (B, H, W, C) -> float32 (B, image_size, image_size, C), as the eval pipeline's
  `resize_center_crop` (`how`: 'square' or 'shorter_side'; `interpolation`: 'bilinear' or
  'bicubic') and `normalize` (scale, offset: float32 (C,))."""
  resized_size = max(image_size, round(image_size * resize_ratio))
  rows, cols = images[0, :, 0, 0], images[0, 0, :, 0]
  height, width = _resized_sides(rows, cols, resized_size, how)
  top = jnp.floor((height - image_size) / 2)
  left = jnp.floor((width - image_size) / 2)
  x = images.astype(jnp.float32)
  highest = jax.lax.Precision.HIGHEST
  x = jnp.einsum('oh,bhwc->bowc', window_weights(rows, height, top, image_size, interpolation), x,
                 precision=highest)
  x = jnp.einsum('pw,bowc->bopc', window_weights(cols, width, left, image_size, interpolation), x,
                 precision=highest)
  crop = jnp.clip(jnp.round(x), 0, 255)  # (B, image_size, image_size, C), as uint8 values.
  return crop * scale + offset
