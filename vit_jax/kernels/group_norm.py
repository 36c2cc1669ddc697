"""Group normalisation on XLA:CPU in one kernel each way (the Python side of `group_norm.cc`).

`group_norm(x, scale, bias, groups, epsilon)` is Flax's `nn.GroupNorm` with its defaults
(statistics in float32, the fast variance E[x^2] - E[x]^2, a scale and a bias). The forward
pass takes one pass over x for the statistics and one to normalise, where XLA:CPU first
writes a bfloat16 x out in float32 and then reads it once for each statistic; the backward
pass reads x and the output's gradient twice. The values are Flax's within float32 rounding
(bfloat16: one rounding of the float32 result), the gradients within float32 rounding of
the analytic ones Flax's autodiff gives.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.kernels import blas


def group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, groups: int,
               epsilon: float) -> jax.Array:
  """x (B, ..., C), scale and bias (C,), in `groups` groups of channels: x's dtype out."""
  rows = x.reshape(x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1])  # (B, S, C)
  out = _group_norm(rows, scale.astype(jnp.float32), bias.astype(jnp.float32), groups,
                    epsilon)
  return out.reshape(x.shape)


def _forward(rows, scale, bias, groups, epsilon):
  """(out, mean, rstd) of rows (B, S, C); mean and rstd (B, groups)."""
  blas.load()  # Registers the FFI targets (once), or says why they cannot run here.
  bfloat16 = rows.dtype == jnp.bfloat16
  statistic = jax.ShapeDtypeStruct((rows.shape[0], groups), jnp.float32)
  call = jax.ffi.ffi_call(
      blas.GROUP_NORM_BF16_TARGET if bfloat16 else blas.GROUP_NORM_TARGET,
      (jax.ShapeDtypeStruct(rows.shape, rows.dtype), statistic, statistic),
      vmap_method='sequential')
  return call(rows, scale, bias, groups=np.int64(groups), epsilon=np.float32(epsilon))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _group_norm(rows, scale, bias, groups, epsilon):
  return _forward(rows, scale, bias, groups, epsilon)[0]


def _group_norm_fwd(rows, scale, bias, groups, epsilon):
  out, mean, rstd = _forward(rows, scale, bias, groups, epsilon)
  return out, (rows, scale, mean, rstd)


def _group_norm_bwd(groups, epsilon, residuals, d_out):
  rows, scale, mean, rstd = residuals
  bfloat16 = rows.dtype == jnp.bfloat16
  channels = jax.ShapeDtypeStruct(scale.shape, jnp.float32)
  call = jax.ffi.ffi_call(
      blas.GROUP_NORM_BACKWARD_BF16_TARGET if bfloat16 else blas.GROUP_NORM_BACKWARD_TARGET,
      (jax.ShapeDtypeStruct(rows.shape, rows.dtype), channels, channels),
      vmap_method='sequential')
  return call(rows, d_out.astype(rows.dtype), scale, mean, rstd)


_group_norm.defvjp(_group_norm_fwd, _group_norm_bwd)
