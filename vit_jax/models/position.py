"""Position encodings: learned (ViT), 1-D sinusoidal (Transformer), 2-D sin-cos."""

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors

Array = jax.Array


def sinusoidal_1d(length: int, width: int, max_timescale: float = 10_000.0) -> np.ndarray:
  """The Transformer paper's encoding, shape (length, width).

  PE[pos, 2i] = sin(pos / max_timescale^(2i / width)) and
  PE[pos, 2i+1] = cos(pos / max_timescale^(2i / width)).
  """
  if width % 2:
    raise errors.ConfigError(f'Sinusoidal position encoding needs an even width, got {width}.')
  position = np.arange(length, dtype=np.float64)[:, None]  # (length, 1)
  inv_freq = max_timescale ** (-np.arange(0, width, 2, dtype=np.float64) / width)
  angles = position * inv_freq[None, :]  # (length, width // 2)
  encoding = np.zeros((length, width), np.float32)
  encoding[:, 0::2] = np.sin(angles)
  encoding[:, 1::2] = np.cos(angles)
  return encoding


def sincos_2d(height: int, width: int, channels: int,
              max_timescale: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sin-cos encoding of a (height, width) patch grid, shape (h*w, channels).

  A quarter of the channels each: sin(y), cos(y), sin(x), cos(x), with
  frequencies spaced geometrically as in the 1-D encoding.
  """
  if channels % 4:
    raise errors.ConfigError(f'2-D sin-cos position encoding needs channels divisible by 4, '
                             f'got {channels}.')
  quarter = channels // 4
  inv_freq = max_timescale ** (-np.arange(quarter, dtype=np.float64) / quarter)
  y, x = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  y_angles = y.reshape(-1, 1) * inv_freq[None, :]  # (h*w, channels // 4)
  x_angles = x.reshape(-1, 1) * inv_freq[None, :]
  return np.concatenate([np.sin(y_angles), np.cos(y_angles),
                         np.sin(x_angles), np.cos(x_angles)], axis=1).astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds a learned position embedding `pos_embedding` of shape (1, tokens, width)."""
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    if inputs.ndim != 3:
      raise ValueError(f'Expected (batch, tokens, width) inputs, got shape {inputs.shape}.')
    shape = (1, inputs.shape[1], inputs.shape[2])
    if self.has_variable('params', 'pos_embedding'):
      held = self.get_variable('params', 'pos_embedding').shape
      if tuple(held) != shape:
        raise errors.ConfigError(
            f'The position embedding holds {held[1]} tokens of width {held[2]}, but the inputs '
            f'give {shape[1]} of width {shape[2]}: images of another size than the weights were '
            'made for. Resize the images to that size, or fit the weights to this one: '
            'vit_jax.weights.load_pretrained(params, model.init(key, images)).')
    pos_embedding = self.param('pos_embedding', self.posemb_init, shape, self.param_dtype)
    return inputs + pos_embedding.astype(inputs.dtype)


class AddSinusoidalPositions(nn.Module):
  """Adds the fixed 1-D sinusoidal encoding; in decode mode, one position per call.

  `positions` (B, T) gives each token's position explicitly (packed sequences);
  by default tokens sit at 0..T-1. With `decode=True` the current position is
  kept in the 'cache' collection, so step t of decoding gets position t.
  """
  max_length: int = 2048
  decode: bool = False

  @nn.compact
  def __call__(self, inputs: Array, positions: Array | None = None) -> Array:
    length, width = inputs.shape[1], inputs.shape[2]
    if length > self.max_length:
      raise errors.ConfigError(f'Sequence of length {length} is longer than max_length='
                               f'{self.max_length} of the position encoding; raise max_length.')
    table = jnp.asarray(sinusoidal_1d(self.max_length, width))  # (max_length, width)
    if self.decode:
      is_initialized = self.has_variable('cache', 'position_index')
      index = self.variable('cache', 'position_index', lambda: jnp.array(0, jnp.int32))
      if is_initialized:
        position = index.value
        index.value = position + 1
        step = jax.lax.dynamic_slice(table, (position, 0), (1, width))  # (1, width)
        return inputs + step[None].astype(inputs.dtype)
    if positions is not None:
      return inputs + table[positions].astype(inputs.dtype)  # (B, T, width)
    return inputs + table[None, :length].astype(inputs.dtype)
