"""ResNet (v1.5 bottleneck, weight-standardised convs + GroupNorm) stem for hybrid ViTs.

`resnet_stem` builds its layers inside the calling module, so a hybrid ViT's
parameters sit at the top level as in the published checkpoints:
`conv_root`, `gn_root`, `block{s}/unit{u}/{conv1,conv2,conv3,conv_proj,gn1,...}`.
"""

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Dtype = Any


def standardize(kernel: Array, axis: Sequence[int] = (0, 1, 2), eps: float = 1e-5) -> Array:
  """Zero mean, unit variance over each output channel's (kh, kw, in) weights."""
  kernel = kernel - jnp.mean(kernel, axis=axis, keepdims=True)
  return kernel / jnp.sqrt(jnp.var(kernel, axis=axis, keepdims=True) + eps)


class StdConv(nn.Conv):
  """Convolution with weight standardisation (Kolesnikov et al., BiT)."""

  def param(self, name, *args, **kwargs):
    value = super().param(name, *args, **kwargs)
    return standardize(value) if name == 'kernel' else value


class ResidualUnit(nn.Module):
  """Bottleneck unit: 1x1 -> 3x3 (strided) -> 1x1 (4x wider), plus a projection."""
  features: int
  strides: tuple[int, int] = (1, 1)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    conv = lambda features, size, strides, name: StdConv(  # noqa: E731
        features, (size, size), strides, use_bias=False, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)
    norm = lambda name, **kw: nn.GroupNorm(  # noqa: E731
        dtype=self.dtype, param_dtype=self.param_dtype, name=name, **kw)

    residual = x
    if x.shape[-1] != self.features * 4 or self.strides != (1, 1):
      residual = conv(self.features * 4, 1, self.strides, 'conv_proj')(residual)
      residual = norm('gn_proj')(residual)
    y = nn.relu(norm('gn1')(conv(self.features, 1, (1, 1), 'conv1')(x)))
    y = nn.relu(norm('gn2')(conv(self.features, 3, self.strides, 'conv2')(y)))
    y = norm('gn3', scale_init=nn.initializers.zeros)(
        conv(self.features * 4, 1, (1, 1), 'conv3')(y))
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """`num_units` ResidualUnits named unit1..unitN; the first may stride."""
  num_units: int
  features: int
  first_stride: tuple[int, int]
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    for i in range(self.num_units):
      x = ResidualUnit(self.features, self.first_stride if i == 0 else (1, 1),
                       dtype=self.dtype, param_dtype=self.param_dtype,
                       name=f'unit{i + 1}')(x)
    return x


def resnet_stem(x: Array, *, num_layers: Sequence[int], width_factor: float = 1,
                dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32) -> Array:
  """Root conv (stride 2) + max-pool (stride 2) + one stage per entry of `num_layers`.

  Call inside a compact method: the layers become children of that module.
  Output stride is 4 * 2^(len(num_layers) - 1) (4 with no stages); output
  width is 64 * width_factor * 4 * 2^(stages - 1) (64 * width_factor with none).
  """
  width = int(64 * width_factor)
  x = StdConv(width, (7, 7), (2, 2), use_bias=False, dtype=dtype,
              param_dtype=param_dtype, name='conv_root')(x)
  x = nn.GroupNorm(dtype=dtype, param_dtype=param_dtype, name='gn_root')(x)
  x = nn.relu(x)
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding='SAME')
  for i, num_units in enumerate(num_layers):
    x = ResNetStage(num_units, width * 2**i, (1, 1) if i == 0 else (2, 2),
                    dtype=dtype, param_dtype=param_dtype, name=f'block{i + 1}')(x)
  return x
