"""Layer normalisation on XLA:CPU in one kernel each way (the Python side of `layer_norm.cc`).

`layer_norm(x, scale, bias, epsilon)` is Flax's `nn.LayerNorm` with its defaults (over the
last axis, statistics in float32, the fast variance E[x^2] - E[x]^2, a scale and a bias).
Each row is read once for its statistics and once from cache to normalise, and the backward
pass likewise; inside a train step XLA:CPU split the same work into several fusions, and
materialised the scale broadcast to the whole (rows, C) array for one of them. The values
are Flax's within float32 rounding (bfloat16: one rounding of the float32 result), the
gradients within float32 rounding of the analytic ones Flax's autodiff gives.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.kernels import blas


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float) -> jax.Array:
  """x (..., C) normalised over C, scale and bias (C,): x's dtype out."""
  rows = x.reshape(-1, x.shape[-1])  # (tokens, C)
  out = _layer_norm(rows, scale.astype(jnp.float32), bias.astype(jnp.float32), epsilon)
  return out.reshape(x.shape)


def _forward(rows, scale, bias, epsilon):
  """(out, mean, rstd) of rows (R, C); mean and rstd (R,)."""
  blas.load()  # Registers the FFI targets (once), or says why they cannot run here.
  bfloat16 = rows.dtype == jnp.bfloat16
  statistic = jax.ShapeDtypeStruct(rows.shape[:1], jnp.float32)
  call = jax.ffi.ffi_call(
      blas.LAYER_NORM_BF16_TARGET if bfloat16 else blas.LAYER_NORM_TARGET,
      (jax.ShapeDtypeStruct(rows.shape, rows.dtype), statistic, statistic),
      vmap_method='sequential')
  return call(rows, scale, bias, epsilon=np.float32(epsilon))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(rows, scale, bias, epsilon):
  return _forward(rows, scale, bias, epsilon)[0]


def _layer_norm_fwd(rows, scale, bias, epsilon):
  out, mean, rstd = _forward(rows, scale, bias, epsilon)
  return out, (rows, scale, mean, rstd)


def _layer_norm_bwd(epsilon, residuals, d_out):
  rows, scale, mean, rstd = residuals
  bfloat16 = rows.dtype == jnp.bfloat16
  channels = jax.ShapeDtypeStruct(scale.shape, jnp.float32)
  call = jax.ffi.ffi_call(
      blas.LAYER_NORM_BACKWARD_BF16_TARGET if bfloat16 else blas.LAYER_NORM_BACKWARD_TARGET,
      (jax.ShapeDtypeStruct(rows.shape, rows.dtype), channels, channels),
      vmap_method='sequential')
  return call(rows, d_out.astype(rows.dtype), scale, mean, rstd)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
