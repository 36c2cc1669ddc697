"""The eval pipeline's preprocessing (`vit_jax.data.preprocess.eval_images`) in jnp.

Exported models with `--preprocess` take uint8 (B, H, W, C) images of any size: a square
bilinear antialiased resize (TF's `resize(..., antialias=True)`, the ScaleAndTranslate
triangle kernel) to round(image_size * eval_resize_ratio), rounding to uint8, the central
(image_size, image_size) crop, and normalization: pixel * scale + offset per channel, which
is (pixel / 255 - mean) / std (`vit_jax.data.normalization.affine`). H and W may be symbolic.
"""

import jax
import jax.numpy as jnp
import numpy as np


def triangle_weights(pixels: jax.Array, out_size: int) -> jax.Array:
  """(out_size, in) float32 weights of an antialiased bilinear resize along one axis.

  `pixels` is any (in,) vector along the axis (its length may be a symbolic dimension: the
  pixel indices are counted from it, which ONNX converters follow). Output pixel o samples
  the input at (o + 0.5) * in / out; input pixel i weighs max(0, 1 - |i + 0.5 - sample| / k),
  k = max(in / out, 1), normalized to sum to 1.
  """
  ones = jnp.ones_like(pixels, dtype=jnp.float32)
  inverse_scale = jnp.sum(ones) / out_size
  kernel_scale = jnp.maximum(inverse_scale, 1.0)
  samples = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) * inverse_scale
  centers = jnp.cumsum(ones) - 0.5  # i + 0.5
  weights = jnp.maximum(0.0, 1.0 - jnp.abs(centers[None] - samples[:, None]) / kernel_scale)
  total = jnp.sum(weights, axis=1, keepdims=True)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)


def resize(images: jax.Array, size: int) -> jax.Array:
  """uint8 (B, H, W, C) -> uint8 (B, size, size, C); exact when H == W == size."""
  rows = triangle_weights(images[0, :, 0, 0], size)
  cols = triangle_weights(images[0, 0, :, 0], size)
  x = images.astype(jnp.float32)
  highest = jax.lax.Precision.HIGHEST
  x = jnp.einsum('oh,bhwc->bowc', rows, x, precision=highest)
  x = jnp.einsum('pw,bowc->bopc', cols, x, precision=highest)
  return jnp.clip(jnp.round(x), 0, 255).astype(jnp.uint8)


def eval_images(images: jax.Array, image_size: int, resize_ratio: float, scale: np.ndarray,
                offset: np.ndarray) -> jax.Array:
  """uint8 (B, H, W, C) -> float32 (B, image_size, image_size, C), as the eval pipeline's
  `resize_center_crop` and `normalize` (scale, offset: float32 (C,))."""
  resized_size = max(image_size, round(image_size * resize_ratio))
  resized = resize(images, resized_size)
  start = (resized_size - image_size) // 2
  crop = resized[:, start:start + image_size, start:start + image_size, :]
  return crop.astype(jnp.float32) * scale + offset
