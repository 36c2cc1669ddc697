"""Group normalisation for inference on XLA:CPU (the Python side of `group_norm.cc`).

`group_norm(x, scale, bias, groups, epsilon)` is Flax's `nn.GroupNorm` with its defaults
(statistics in float32, the fast variance E[x^2] - E[x]^2, a scale and a bias).
Undifferentiated it runs `group_norm.cc`: one pass over x for the statistics and one to
normalise, where XLA:CPU first writes a bfloat16 x out in float32 and then reads it once for
each statistic. Differentiated, it is the layer as Flax computes it, with its gradient.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vit_jax.kernels import blas, custom_rules


def group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, groups: int,
               epsilon: float) -> jax.Array:
  """x (B, ..., C), scale and bias (C,), in `groups` groups of channels: x's dtype out."""
  return _group_norm(x, scale.astype(jnp.float32), bias.astype(jnp.float32), groups, epsilon)


def _as_flax(x, scale, bias, groups, epsilon):
  """`nn.GroupNorm(num_groups=groups, epsilon=epsilon, dtype=x.dtype)` of x with these params,
  operation for operation as Flax computes it (so that its gradients are Flax's, bit for bit)."""
  width = x.shape[-1] // groups
  grouped = x.reshape(x.shape[:-1] + (groups, width)).astype(jnp.float32)
  axes = tuple(range(1, x.ndim - 1)) + (x.ndim,)  # The positions and the group's channels.
  mean, mean_sq = grouped.mean(axes), lax.square(grouped).mean(axes)  # (B, groups)
  var = jnp.maximum(0.0, mean_sq - lax.square(mean))
  positions = tuple(range(1, x.ndim - 1))
  mean = jnp.expand_dims(jnp.repeat(mean, width, axis=-1), positions)  # (B, 1, ..., C)
  var = jnp.expand_dims(jnp.repeat(var, width, axis=-1), positions)
  multiplier = lax.rsqrt(var + epsilon) * scale
  return ((x - mean) * multiplier + bias).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _group_norm(x, scale, bias, groups, epsilon):
  blas.load()  # Registers the FFI targets (once), or says why they cannot run here.
  target = blas.GROUP_NORM_BF16_TARGET if x.dtype == jnp.bfloat16 else blas.GROUP_NORM_TARGET
  rows = x.reshape(x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1])  # (B, S, C)
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(rows.shape, x.dtype),
                          vmap_method='sequential')
  out = call(rows, scale, bias, groups=np.int64(groups), epsilon=np.float32(epsilon))
  return out.reshape(x.shape)


def _group_norm_fwd(x, scale, bias, groups, epsilon):
  return custom_rules.vjp_of_perturbed(
      lambda *a: _as_flax(*a, groups, epsilon), x, scale, bias)


def _group_norm_bwd(groups, epsilon, residuals, d_out):
  return custom_rules.cotangents(residuals, d_out)


_group_norm.defvjp(_group_norm_fwd, _group_norm_bwd, symbolic_zeros=True)
