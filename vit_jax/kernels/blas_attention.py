"""Multi-head attention on the BLAS: the Python side of `attention.cc`.

q (B, T, N, H), k and v (B, S, N, H) in the layout the projections produce, and an
optional boolean mask (True = attend) the same for every head (`mask_rows` says which
masks are). `attention` (float32) and `attention_bfloat16` have their own gradients;
undifferentiated, they call kernels that keep no attention weights. The kernels are built
and registered by `vit_jax.kernels.blas.load`.
"""

import jax
import jax.numpy as jnp

from vit_jax.kernels import blas


def mask_rows(mask: jax.Array, query_shape: tuple, key_shape: tuple) -> jax.Array | None:
  """`mask` (broadcastable to (B, N, T, S)) as the kernels take it, (B or 1, T, S) booleans;
  None where it differs between heads (the kernels apply one mask to every head)."""
  (batch, queries, _, _), keys = query_shape, key_shape[1]
  mask = jnp.asarray(mask, bool)
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (B|1, N|1, T|1, S|1)
  if mask.shape[1] != 1:
    return None
  rows = jnp.broadcast_shapes(mask.shape, (1, 1, queries, keys))
  mask = jnp.broadcast_to(mask, rows)[:, 0]  # (B|1, T, S)
  return mask if mask.shape[0] in (1, batch) else None


def _with_mask(arguments: tuple, mask) -> tuple:
  """A kernel's arguments, with the optional mask last where there is one."""
  return arguments if mask is None else (*arguments, mask)


def _forward_only(target: str, dtype, query, key, value, mask) -> jax.Array:
  """The forward-only kernel `target` on (query, key, value[, mask]), its result in `dtype`."""
  blas.load()
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(query.shape, dtype),
                          vmap_method='sequential')
  return call(*_with_mask((query, key, value), mask))


@jax.custom_vjp
def attention(query: jax.Array, key: jax.Array, value: jax.Array,
              mask: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(H)) v per head, float32, on the BLAS.

  query (B, T, N, H), key and value (B, S, N, H) -> (B, T, N, H); `mask` (B or 1, T, S)
  booleans (`mask_rows`), True = attend, or None. Masked keys weigh nothing, as with
  `plain_attention`'s where(mask, scores, lowest float): a query that attends to no key
  weighs all equally, and masked scores get no gradient. When differentiated, the forward
  pass keeps the weights (B, N, T, S) for the backward pass: memory grows with T * S,
  like `plain_attention`'s. Otherwise each head's weights stay in a per-thread buffer.
  """
  return _forward_only(blas.ATTENTION_INFERENCE_TARGET, jnp.float32, query, key, value, mask)


def _forward_keeping_weights(target: str, query, key, value, mask):
  """The training forward kernel `target`: its result in the inputs' dtype, and the residuals
  (the inputs, the mask, the float32 weights (B, N, T, S)) for `_backward`."""
  batch, queries, heads, _ = query.shape
  blas.load()
  shapes = (jax.ShapeDtypeStruct(query.shape, query.dtype),
            jax.ShapeDtypeStruct((batch, heads, queries, key.shape[1]), jnp.float32))
  call = jax.ffi.ffi_call(target, shapes, vmap_method='sequential')
  out, probs = call(*_with_mask((query, key, value), mask))
  return out, (query, key, value, mask, probs)


def _backward(target: str, residuals, d_out) -> tuple:
  """The backward kernel `target`: the gradients of q, k and v in their dtype (none for the
  mask)."""
  query, key, value, mask, probs = residuals
  shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (query, key, value))
  call = jax.ffi.ffi_call(target, shapes, vmap_method='sequential')
  return (*call(*_with_mask((query, key, value, probs, d_out.astype(query.dtype)), mask)),
          None)


def _attention_fwd(query, key, value, mask=None):
  return _forward_keeping_weights(blas.ATTENTION_FORWARD_TARGET, query, key, value, mask)


def _attention_bwd(residuals, d_out):
  return _backward(blas.ATTENTION_BACKWARD_TARGET, residuals, d_out)


attention.defvjp(_attention_fwd, _attention_bwd)


def _as_float32(*arrays):
  return tuple(x.astype(jnp.float32) for x in arrays)


@jax.custom_vjp
def attention_bfloat16(query: jax.Array, key: jax.Array, value: jax.Array,
                       mask: jax.Array | None = None) -> jax.Array:
  """`attention` of bfloat16 inputs, bfloat16 result.

  Where MKL multiplies bfloat16 (`blas.has_bfloat16_products`), on its bfloat16 product:
  the scores accumulated and the softmax computed in float32, the weights rounded to
  bfloat16 for the second product (as torch's and XLA's bfloat16 attention round them), its
  float32 sums rounded once. Differentiated, the forward pass keeps the float32 weights, and
  the backward pass multiplies bfloat16 operands too (the weights and their gradient rounded
  to bfloat16, the softmax's gradient in float32), each gradient rounded once. Without that
  product, `attention` in float32, its results rounded to bfloat16 (XLA:CPU emulates
  bfloat16 arithmetic, which makes its bfloat16 attention slower than float32 on the BLAS).
  """
  if not blas.has_bfloat16_products():
    return attention(*_as_float32(query, key, value), mask).astype(jnp.bfloat16)
  return _forward_only(blas.ATTENTION_INFERENCE_BF16_TARGET, jnp.bfloat16, query, key, value,
                       mask)


def _attention_bfloat16_fwd(query, key, value, mask=None):
  if not blas.has_bfloat16_products():
    out, residuals = _attention_fwd(*_as_float32(query, key, value), mask)
    return out.astype(jnp.bfloat16), residuals
  return _forward_keeping_weights(blas.ATTENTION_FORWARD_BF16_TARGET, query, key, value, mask)


def _attention_bfloat16_bwd(residuals, d_out):
  if residuals[0].dtype == jnp.float32:  # Without MKL's bfloat16 product: `attention`'s.
    *grads, _ = _attention_bwd(residuals, d_out)
    return (*(grad.astype(jnp.bfloat16) for grad in grads), None)
  return _backward(blas.ATTENTION_BACKWARD_BF16_TARGET, residuals, d_out)


attention_bfloat16.defvjp(_attention_bfloat16_fwd, _attention_bfloat16_bwd)
