"""A bfloat16 bias add whose gradient is summed in float32.

The gradient of a Dense layer's bias is its output gradient summed over the rows. Autodiff
sums a bfloat16 gradient in bfloat16, which XLA:CPU compiles as windows of 32x32 rows read
down the columns (`reduce-window`): slowly, and not to the exact sum rounded. `add_bias`
sums it in float32 and rounds once.
"""

import jax
import jax.numpy as jnp


@jax.custom_vjp
def add_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
  """y (..., *F) + bias (*F); the bias gradient summed over the rows in float32."""
  return y + bias


def _add_bias_fwd(y, bias):
  return y + bias, bias


def _add_bias_bwd(bias, d_y):
  rows = d_y.reshape(-1, bias.size).astype(jnp.float32)  # (tokens, prod F)
  return d_y, rows.sum(axis=0).reshape(bias.shape).astype(bias.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)
