"""The attention kernels on (B, T, N, H) inputs: written out, XLA's and cuDNN's, head-major.

Shapes as in `vit_jax.models.attention`: B batch, T query length, S key/value length,
N heads, H head_dim. Each takes a boolean mask broadcastable to (B, N, T, S), True =
attend, or None; `fused_attention` also takes a `KeyPadding`.
"""

import jax
import jax.numpy as jnp

from vit_jax.models.masks import KeyPadding

Array = jax.Array


def dot_product_attention_weights(query: Array, key: Array,
                                  mask: Array | None = None) -> Array:
  """softmax(q k^T / sqrt(H)) with masked scores set to a large negative value.

  Args:
    query: (B, T, N, H).
    key: (B, S, N, H).
    mask: bool, broadcastable to (B, N, T, S); True = attend.

  Returns:
    Weights (B, N, T, S) in float32 (the softmax always runs in float32).
  """
  head_dim = query.shape[-1]
  logits = jnp.einsum('btnh,bsnh->bnts', query, key)  # (B, N, T, S)
  logits = logits.astype(jnp.float32) / jnp.sqrt(jnp.float32(head_dim))
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def plain_attention(query: Array, key: Array, value: Array,
                    mask: Array | None = None, *,
                    dropout_rate: float = 0.0,
                    dropout_rng: Array | None = None) -> tuple[Array, Array]:
  """Attention written out step by step; also returns the weights.

  Returns:
    (output (B, T, N, H) in the dtype of `value`, weights (B, N, T, S) float32).
  """
  weights = dot_product_attention_weights(query, key, mask)
  probs = weights
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum('bnts,bsnh->btnh', probs.astype(value.dtype), value)
  return out, weights


def fused_attention(query: Array, key: Array, value: Array,
                    mask: Array | KeyPadding | None = None, *, cudnn: bool = False) -> Array:
  """Attention through `jax.nn.dot_product_attention`.

  Same inputs and result as `plain_attention`, without the weights; a `KeyPadding`
  mask goes in as key lengths (for cuDNN, its padding mask instead of a bias). With
  `cudnn`, cuDNN's flash attention runs where it takes the inputs (a GPU with
  cuDNN; float16/bfloat16; head_dim a multiple of 8, up to 128, or 256 from Hopper
  on) and XLA elsewhere. cuDNN has no gradient for odd lengths, and says so only
  when differentiated, maybe outside this call (under `jax.checkpoint` or a scan):
  unmasked odd lengths run padded to even lengths with the padding masked out by
  sequence lengths; masked odd lengths use XLA. (`layers.Encoder` pads its tokens once,
  ViT's 197 to 198, so that its layers call this with even lengths.)
  """
  key_lengths = None
  if isinstance(mask, KeyPadding):
    key_lengths = jnp.full((query.shape[0],), mask.length, jnp.int32)  # (B,)
    mask = None
  elif mask is not None:
    # The fused kernel wants a rank-4 mask broadcastable to (B, N, T, S).
    mask = jnp.broadcast_to(mask, jnp.broadcast_shapes(
        mask.shape, (1, 1, query.shape[1], key.shape[1])))
  lengths_even = query.shape[1] % 2 == 0 and key.shape[1] % 2 == 0
  if cudnn and (mask is None or lengths_even):
    try:
      if lengths_even:
        return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                            key_value_seq_lengths=key_lengths,
                                            implementation='cudnn')
      return _cudnn_attention_padded_to_even(query, key, value, key_lengths)
    except (NotImplementedError, RuntimeError, ValueError):
      pass  # cuDNN cannot run these inputs here: XLA below.
  return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                      key_value_seq_lengths=key_lengths)


def _cudnn_attention_padded_to_even(query: Array, key: Array, value: Array,
                                    key_lengths: Array | None) -> Array:
  """cuDNN attention on (B, T, N, H) inputs of odd T or S, padded by one.

  `key_lengths` (B,): the real keys of each example; None: all S.
  """
  batch, queries, keys = query.shape[0], query.shape[1], key.shape[1]
  if key_lengths is None:
    key_lengths = jnp.full((batch,), keys, jnp.int32)

  def pad_to_even(x):  # (B, L, N, H) -> (B, L rounded up to even, N, H)
    return jnp.pad(x, ((0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)))

  out = jax.nn.dot_product_attention(
      pad_to_even(query), pad_to_even(key), pad_to_even(value), implementation='cudnn',
      query_seq_lengths=jnp.full((batch,), queries, jnp.int32),
      key_value_seq_lengths=key_lengths)
  return out[:, :queries]


def head_major_attention(query: Array, key: Array, value: Array,
                         mask: Array | None = None) -> Array:
  """Attention as two head-major einsums, normalised after the value product.

  Same inputs and result as `plain_attention`, without the weights; what 'auto'
  runs on CPUs. With the heads leading, each einsum is one batched matrix product
  for XLA:CPU, and the softmax divides the (T, H) output rather than the (T, S)
  weights: about twice as fast there as `fused_attention`, and differentiated by
  JAX as usual.
  """
  scale = 1.0 / jnp.sqrt(jnp.float32(query.shape[-1]))
  q, k, v = (x.transpose(0, 2, 1, 3) for x in (query, key, value))  # (B, N, T|S, H)
  logits = jnp.einsum('bnth,bnsh->bnts', q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  # The softmax does not depend on the shift: no gradient flows through it.
  row_max = jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True))
  unnormalised = jnp.exp(logits - row_max)  # (B, N, T, S)
  out = jnp.einsum('bnts,bnsh->bnth', unnormalised.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  out = out / unnormalised.sum(axis=-1, keepdims=True)
  return out.transpose(0, 2, 1, 3).astype(value.dtype)
