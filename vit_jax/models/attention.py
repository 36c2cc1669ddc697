"""Multi-head dot-product attention: masks, a plain and a fused kernel, the module.

Shapes use these letters: B batch, T query length, S key/value length,
N heads, H head_dim, D model width.
"""

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Dtype = Any

ATTENTION_IMPLEMENTATIONS = ('fused', 'plain')


def make_padding_mask(query_valid: Array, key_valid: Array) -> Array:
  """Boolean mask (B, 1, T, S): True where both query t and key s are valid.

  Args:
    query_valid: (B, T) bool or 0/1, e.g. `query_tokens > 0`.
    key_valid: (B, S) bool or 0/1.
  """
  return jnp.logical_and(query_valid[:, None, :, None].astype(bool),
                         key_valid[:, None, None, :].astype(bool))


def make_causal_mask(length: int) -> Array:
  """Boolean mask (1, 1, T, T): query t sees keys 0..t."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None (None if all are)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  mask = masks[0].astype(bool)
  for m in masks[1:]:
    mask = jnp.logical_and(mask, m.astype(bool))
  return mask


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
                    mask: Array | None = None) -> Array:
  """Attention through `jax.nn.dot_product_attention` (cuDNN flash on GPUs).

  Same inputs and result as `plain_attention`, without the weights.
  """
  if mask is not None:
    # The fused kernel wants a rank-4 mask broadcastable to (B, N, T, S).
    mask = jnp.broadcast_to(mask, jnp.broadcast_shapes(
        mask.shape, (1, 1, query.shape[1], key.shape[1])))
  return jax.nn.dot_product_attention(query, key, value, mask=mask)


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention with per-head q/k/v projections and an output W^o.

  Parameter names and shapes follow the published ViT checkpoints:
  `query|key|value/kernel` (D, N, H), `query|key|value/bias` (N, H),
  `out/kernel` (N, H, D_out), `out/bias` (D_out,).

  Call as `attn(inputs_q)` for self-attention or `attn(inputs_q, inputs_kv)`
  for cross-attention. With `decode=True` the module keeps a key/value cache in
  the 'cache' collection and takes one query token per call.
  """
  num_heads: int
  qkv_features: int | None = None  # Total q/k/v width N*H; default: input width.
  out_features: int | None = None  # Output width; default: input width.
  dropout_rate: float = 0.0  # Dropout on the attention weights (plain path).
  use_bias: bool = True
  implementation: str = 'fused'  # 'fused' (jax.nn.dot_product_attention) or 'plain'.
  decode: bool = False  # Autoregressive decoding with a key/value cache.
  dtype: Dtype = jnp.float32  # Compute dtype.
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()
  bias_init: Callable = nn.initializers.zeros

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               mask: Array | None = None, causal: bool = False,
               deterministic: bool = True,
               return_weights: bool = False) -> Array | tuple[Array, Array]:
    """Attends from `inputs_q` (B, T, D) to `inputs_kv` (B, S, D).

    Args:
      inputs_q: queries (B, T, D).
      inputs_kv: keys/values (B, S, D); None for self-attention.
      mask: bool, broadcastable to (B, N, T, S); True = attend.
      causal: add a causal mask (query t sees keys <= t). Ignored with
        `decode=True`, where the cache already hides future positions.
      deterministic: disable attention dropout.
      return_weights: also return the attention weights (B, N, T, S); uses
        the plain path.

    Returns:
      (B, T, D_out), or (output, weights) if `return_weights`.
    """
    if self.implementation not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(
          f'Unknown attention implementation {self.implementation!r}; '
          f'choose one of {ATTENTION_IMPLEMENTATIONS}.')
    if inputs_kv is None:
      inputs_kv = inputs_q
    features = self.qkv_features or inputs_q.shape[-1]
    if features % self.num_heads:
      raise ValueError(
          f'Attention width {features} is not divisible by num_heads='
          f'{self.num_heads}; pick a hidden size that is a multiple of the '
          'number of heads.')
    head_dim = features // self.num_heads

    def projection(name):
      return nn.DenseGeneral(
          features=(self.num_heads, head_dim), use_bias=self.use_bias,
          dtype=self.dtype, param_dtype=self.param_dtype,
          kernel_init=self.kernel_init, bias_init=self.bias_init, name=name)

    query = projection('query')(inputs_q)  # (B, T, N, H)
    key = projection('key')(inputs_kv)  # (B, S, N, H)
    value = projection('value')(inputs_kv)  # (B, S, N, H)

    if self.decode:
      key, value, cache_mask = self._update_cache(key, value)
      mask = combine_masks(mask, cache_mask)
    elif causal:
      mask = combine_masks(mask, make_causal_mask(query.shape[1]))

    dropout_rng = None
    if self.dropout_rate > 0.0 and not deterministic:
      dropout_rng = self.make_rng('dropout')
    if self.implementation == 'plain' or return_weights or dropout_rng is not None:
      out, weights = plain_attention(query, key, value, mask,
                                     dropout_rate=self.dropout_rate,
                                     dropout_rng=dropout_rng)
      self.sow('intermediates', 'attention_weights', weights)
    else:
      out, weights = fused_attention(query, key, value, mask), None

    out = nn.DenseGeneral(
        features=self.out_features or inputs_q.shape[-1], axis=(-2, -1),
        use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        name='out')(out)  # (B, T, D_out)
    return (out, weights) if return_weights else out

  def _update_cache(self, key: Array, value: Array) -> tuple[Array, Array, Array | None]:
    """Writes this step's key/value into the cache; returns the full cache.

    At init time (no cache yet) the cache is created with the shapes of the
    given key/value, i.e. the maximum decode length, and left empty.
    """
    is_initialized = self.has_variable('cache', 'cached_key')
    cached_key = self.variable('cache', 'cached_key', jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable('cache', 'cached_value', jnp.zeros, value.shape,
                                 value.dtype)
    cache_index = self.variable('cache', 'cache_index',
                                lambda: jnp.array(0, dtype=jnp.int32))
    if not is_initialized:
      return key, value, make_causal_mask(key.shape[1])
    batch, max_length, num_heads, head_dim = cached_key.value.shape
    if key.shape != (batch, 1, num_heads, head_dim):
      raise ValueError(
          'With decode=True the attention takes one token per call: expected '
          f'keys of shape {(batch, 1, num_heads, head_dim)}, got {key.shape}.')
    index = cache_index.value
    cached_key.value = jax.lax.dynamic_update_slice(
        cached_key.value, key.astype(cached_key.value.dtype), (0, index, 0, 0))
    cached_value.value = jax.lax.dynamic_update_slice(
        cached_value.value, value.astype(cached_value.value.dtype), (0, index, 0, 0))
    cache_index.value = index + 1
    # The query at position `index` sees cache slots 0..index.
    cache_mask = (jnp.arange(max_length) <= index)[None, None, None, :]  # (1, 1, 1, S)
    return cached_key.value, cached_value.value, cache_mask
