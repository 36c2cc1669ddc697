"""Chunked attention: a scan over key chunks with a streaming softmax (memory linear in S).

Shapes as in `vit_jax.models.attention`: B batch, T query length, S key/value length,
N heads, H head_dim; C keys per chunk, C# chunks.
"""

import jax
import jax.numpy as jnp

from vit_jax import errors

Array = jax.Array


def _chunk_keys(x: Array, num_chunks: int, chunk: int) -> Array:
  """(B, S_pad, N, H) -> (num_chunks, B, N, chunk, H)."""
  batch, _, heads, head_dim = x.shape
  x = x.reshape(batch, num_chunks, chunk, heads, head_dim)
  return x.transpose(1, 0, 3, 2, 4)


def _chunk_logits(q: Array, k: Array, mask: Array | None, key_valid: Array | None,
                  scale: float) -> Array:
  """Scaled float32 scores (B, N, T, C) of one key chunk.

  q (B, N, T, H), k (B, N, C, H); `mask` and `key_valid` (None or bool,
  broadcastable to (B, N, T, C)). Masked keys get the same finite value as in
  `plain_attention` (so a fully masked row averages the real keys, as there);
  padded keys get -inf.
  """
  s = jnp.einsum('bnth,bnch->bntc', q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
  if key_valid is not None:
    s = jnp.where(key_valid, s, -jnp.inf)
  return s


@jax.custom_vjp
def _flash(q: Array, k: Array, v: Array, mask: Array | None,
           key_valid: Array) -> Array:
  """Streaming-softmax attention over key chunks; see `chunked_attention`.

  q (B, N, T, H); k, v (C#, B, N, C, H); mask None or (C#, mB, mN, mT, C) bool;
  key_valid None (no padding) or (C#, 1, 1, 1, C) bool. Returns (B, N, T, H)
  in float32.
  """
  return _flash_forward(q, k, v, mask, key_valid)[0]


def _flash_forward(q, k, v, mask, key_valid):
  batch, heads, length, head_dim = q.shape
  scale = 1.0 / float(head_dim) ** 0.5

  def step(carry, chunk):
    acc, running_max, running_sum = carry
    k_c, v_c, mask_c, valid_c = chunk
    s = _chunk_logits(q, k_c, mask_c, valid_c, scale)  # (B, N, T, C)
    new_max = jnp.maximum(running_max, s.max(axis=-1))  # Finite after chunk 0.
    correction = jnp.exp(running_max - new_max)
    p = jnp.exp(s - new_max[..., None])
    running_sum = running_sum * correction + p.sum(axis=-1)
    acc = acc * correction[..., None] + jnp.einsum(
        'bntc,bnch->bnth', p.astype(v_c.dtype), v_c, preferred_element_type=jnp.float32)
    return (acc, new_max, running_sum), None

  init = (jnp.zeros((batch, heads, length, head_dim), jnp.float32),
          jnp.full((batch, heads, length), -jnp.inf, jnp.float32),
          jnp.zeros((batch, heads, length), jnp.float32))
  (acc, running_max, running_sum), _ = jax.lax.scan(step, init, (k, v, mask, key_valid))
  inv_sum = 1.0 / running_sum  # (B, N, T)
  return acc * inv_sum[..., None], (running_max, inv_sum)


def _flash_fwd(q, k, v, mask, key_valid):
  out, stats = _flash_forward(q, k, v, mask, key_valid)
  return out, (q, k, v, mask, key_valid, out, stats)


def _flash_bwd(residuals, d_out):
  """Recomputes each chunk's probabilities from the saved row max and sum."""
  q, k, v, mask, key_valid, out, (row_max, inv_sum) = residuals
  scale = 1.0 / float(q.shape[-1]) ** 0.5
  delta = jnp.sum(d_out * out, axis=-1)  # (B, N, T): sum_s p_s dp_s.

  def step(d_q, chunk):
    k_c, v_c, mask_c, valid_c = chunk
    s = _chunk_logits(q, k_c, mask_c, valid_c, scale)
    # Max and sum kept apart (not a log-sum-exp), exact for fully masked rows too.
    p = jnp.exp(s - row_max[..., None]) * inv_sum[..., None]  # (B, N, T, C)
    d_v = jnp.einsum('bntc,bnth->bnch', p, d_out)
    d_p = jnp.einsum('bnth,bnch->bntc', d_out, v_c, preferred_element_type=jnp.float32)
    d_s = p * (d_p - delta[..., None]) * scale
    if mask_c is not None:  # Masked scores are constants in the forward pass.
      d_s = jnp.where(mask_c, d_s, 0.0)
    d_q = d_q + jnp.einsum('bntc,bnch->bnth', d_s, k_c, preferred_element_type=jnp.float32)
    d_k = jnp.einsum('bntc,bnth->bnch', d_s, q, preferred_element_type=jnp.float32)
    return d_q, (d_k.astype(k_c.dtype), d_v.astype(v_c.dtype))

  d_q, (d_k, d_v) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32),
                                 (k, v, mask, key_valid))
  return d_q.astype(q.dtype), d_k, d_v, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def chunked_attention(query: Array, key: Array, value: Array,
                      mask: Array | None = None, *, chunk_size: int = 512) -> Array:
  """Memory-efficient attention: a scan over key chunks with a streaming softmax.

  Same inputs and result as `plain_attention` (without the weights), but the
  (T, S) score matrix is never built: each step scores `chunk_size` keys and
  updates a running max, running sum and float32 accumulator, so memory grows
  linearly with the key length. The gradient (a custom VJP) also loops over
  key chunks, recomputing the scores from the saved softmax row max and sum;
  being a custom VJP, it supports reverse-mode differentiation only (no jvp).

  Args:
    query: (B, T, N, H).
    key: (B, S, N, H).
    value: (B, S, N, H).
    mask: bool, broadcastable to (B, N, T, S); True = attend.
    chunk_size: keys per step; S is padded (and the padding masked out) to a
      multiple of it when longer.

  Returns:
    (B, T, N, H) in the dtype of `value`.
  """
  if chunk_size < 1:
    raise errors.ConfigError(f'chunk_size must be positive, got {chunk_size}.')
  length = key.shape[1]
  chunk = min(chunk_size, length)
  num_chunks = -(-length // chunk)
  pad = num_chunks * chunk - length
  key_valid = None  # Padding keys, when S is not a multiple of the chunk, are masked.
  if pad:
    key, value = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (key, value))
    key_valid = (jnp.arange(num_chunks * chunk) < length).reshape(num_chunks, 1, 1, 1, chunk)
  if mask is not None:
    if mask.ndim > 4:
      raise ValueError(f'The mask must broadcast to (B, N, T, S); got shape {mask.shape}.')
    mask = jnp.asarray(mask, bool).reshape((1,) * (4 - mask.ndim) + mask.shape)
    target = jnp.broadcast_shapes(mask.shape, (1, 1, 1, length))
    mask = jnp.broadcast_to(mask, target[:3] + (length,))  # Keep size-1 B, N, T axes.
    mask = jnp.pad(mask, ((0, 0),) * 3 + ((0, pad),))
    mask = mask.reshape(mask.shape[:3] + (num_chunks, chunk)).transpose(3, 0, 1, 2, 4)
  out = _flash(query.transpose(0, 2, 1, 3), _chunk_keys(key, num_chunks, chunk),
               _chunk_keys(value, num_chunks, chunk), mask, key_valid)
  return out.transpose(0, 2, 1, 3).astype(value.dtype)
