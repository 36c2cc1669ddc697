"""Multi-head dot-product attention: masks, plain, fused and chunked kernels, the module.

Shapes use these letters: B batch, T query length, S key/value length,
N heads, H head_dim, D model width.

The module's `implementation` picks the kernel: 'fused' (`jax.nn.dot_product_attention`,
XLA), 'plain' (returns and sows the weights), 'chunked' (memory linear in S), 'blas'
(`vit_jax.kernels.blas.attention`, on MKL; unmasked float32 calls only, the others
run 'head_major'), or 'auto' (the default), which `resolve_attention_impl` turns into
the fastest kernel for the backend, dtype and `matmul` option at trace time.
"""

from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.kernels import blas
from vit_jax.models import partitioning

Array = jax.Array
Dtype = Any
# Kernels whose training already said that attention dropout moved it to 'plain'.
DROPOUT_NOTED: set[str] = set()

ATTENTION_IMPLEMENTATIONS = ('auto', 'fused', 'plain', 'chunked', 'blas')
# Cache entries of cross-attention while decoding: the projected keys/values of the
# encoder output, the same at every step (and for every beam of one example).
CROSS_ATTENTION_CACHE = ('cross_key', 'cross_value')


def resolve_attention_impl(implementation: str, *, backend: str | None = None,
                           dtype: Dtype = jnp.float32, matmul: str = 'auto') -> str:
  """The kernel that `implementation` runs on `backend` for inputs of `dtype`.

  'auto' becomes 'cudnn' (cuDNN flash attention through
  `jax.nn.dot_product_attention`) on GPUs for float16/bfloat16; on CPUs 'blas'
  where the `matmul` option resolves to the BLAS for float32
  (`vit_jax.kernels.blas.resolve_matmul`: MKL on Intel CPUs), else 'head_major'
  (`head_major_attention`, the fastest formulation on XLA:CPU); and 'fused'
  (XLA) otherwise. Other implementations stay as they are.

  Args:
    implementation: one of `ATTENTION_IMPLEMENTATIONS`.
    backend: 'cpu', 'gpu', 'tpu', ...; default: `jax.default_backend()`.
    dtype: the dtype of the queries and keys.
    matmul: the model's `matmul` option ('auto', 'xla', 'blas').
  """
  if implementation not in ATTENTION_IMPLEMENTATIONS:
    raise errors.ConfigError(f'Unknown attention implementation {implementation!r}; '
                             f'choose one of {ATTENTION_IMPLEMENTATIONS}.')
  if implementation != 'auto':
    return implementation
  backend = backend or jax.default_backend()
  if backend == 'cpu':
    on_blas = (jnp.dtype(dtype) == jnp.float32
               and blas.resolve_matmul(matmul, dtype=dtype) == 'blas')
    return 'blas' if on_blas else 'head_major'
  if backend == 'gpu' and jnp.dtype(dtype) in (jnp.float16, jnp.bfloat16):
    return 'cudnn'
  return 'fused'


def make_padding_mask(query_valid: Array, key_valid: Array) -> Array:
  """Boolean mask (B, 1, T, S): True where both query t and key s are valid.

  Args:
    query_valid: (B, T) bool or 0/1, e.g. `query_tokens > 0`.
    key_valid: (B, S) bool or 0/1.
  """
  return jnp.logical_and(query_valid[:, None, :, None].astype(bool),
                         key_valid[:, None, None, :].astype(bool))


def make_segment_mask(query_segments: Array, key_segments: Array) -> Array:
  """Boolean mask (B, 1, T, S): True where query t and key s are in the same segment.

  Segments number the examples packed into one row (1, 2, ...; 0 is padding).
  """
  return query_segments[:, None, :, None] == key_segments[:, None, None, :]


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
                    mask: Array | None = None, *, cudnn: bool = False) -> Array:
  """Attention through `jax.nn.dot_product_attention`.

  Same inputs and result as `plain_attention`, without the weights. With
  `cudnn`, cuDNN's flash attention runs where it takes the inputs (a GPU with
  cuDNN; float16/bfloat16; head_dim a multiple of 8, up to 128, or 256 from Hopper
  on) and XLA elsewhere. cuDNN has no gradient for odd lengths, and says so only
  when differentiated, maybe outside this call (under `jax.checkpoint` or a scan):
  unmasked odd lengths (ViT's 197 tokens) run padded to even lengths with the
  padding masked out by sequence lengths; masked odd lengths use XLA.
  """
  if mask is not None:
    # The fused kernel wants a rank-4 mask broadcastable to (B, N, T, S).
    mask = jnp.broadcast_to(mask, jnp.broadcast_shapes(
        mask.shape, (1, 1, query.shape[1], key.shape[1])))
  lengths_even = query.shape[1] % 2 == 0 and key.shape[1] % 2 == 0
  if cudnn and (mask is None or lengths_even):
    try:
      if lengths_even:
        return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                            implementation='cudnn')
      return _cudnn_attention_padded_to_even(query, key, value)
    except (NotImplementedError, RuntimeError, ValueError):
      pass  # cuDNN cannot run these inputs here: XLA below.
  return jax.nn.dot_product_attention(query, key, value, mask=mask)


def _cudnn_attention_padded_to_even(query: Array, key: Array, value: Array) -> Array:
  """Unmasked cuDNN attention on (B, T, N, H) inputs of odd T or S, padded by one."""
  batch, queries, keys = query.shape[0], query.shape[1], key.shape[1]

  def pad_to_even(x):  # (B, L, N, H) -> (B, L rounded up to even, N, H)
    return jnp.pad(x, ((0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)))

  out = jax.nn.dot_product_attention(
      pad_to_even(query), pad_to_even(key), pad_to_even(value), implementation='cudnn',
      query_seq_lengths=jnp.full((batch,), queries, jnp.int32),
      key_value_seq_lengths=jnp.full((batch,), keys, jnp.int32))
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


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention with per-head q/k/v projections and an output W^o.

  Parameter names and shapes follow the published ViT checkpoints:
  `query|key|value/kernel` (D, N, H), `query|key|value/bias` (N, H),
  `out/kernel` (N, H, D_out), `out/bias` (D_out,).

  Call as `attn(inputs_q)` for self-attention or `attn(inputs_q, inputs_kv)`
  for cross-attention. With `decode=True` the module keeps a cache in the
  'cache' collection: self-attention takes one query token per call and appends
  its key/value; cross-attention projects `inputs_kv` (the same at every step) on
  the first call after `init`, stores the keys/values (`CROSS_ATTENTION_CACHE`)
  and reuses them on later calls, so the cache gains these entries then.
  """
  num_heads: int
  qkv_features: int | None = None  # Total q/k/v width N*H; default: input width.
  out_features: int | None = None  # Output width; default: input width.
  dropout_rate: float = 0.0  # Dropout on the attention weights (plain path).
  use_bias: bool = True
  implementation: str = 'auto'  # 'auto', 'fused', 'plain', 'chunked' or 'blas' (see the top).
  attention_chunk_size: int = 512  # Keys per step of the 'chunked' implementation.
  decode: bool = False  # Autoregressive decoding with a key/value cache.
  matmul: str = 'auto'  # Projections: 'auto', 'xla' or 'blas' (see vit_jax.kernels.blas).
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
    self_attention = inputs_kv is None
    if self_attention:
      inputs_kv = inputs_q
    features = self.qkv_features or inputs_q.shape[-1]
    if features % self.num_heads:
      raise errors.ConfigError(
          f'Attention width {features} is not divisible by num_heads='
          f'{self.num_heads}; pick a hidden size that is a multiple of the '
          'number of heads.')
    head_dim = features // self.num_heads
    dot_general = blas.dot_general_for(self.matmul, self.dtype)

    # Logical axis names: tensor parallelism splits 'heads' (vit_jax.train.mesh).
    def projection(name):
      return nn.DenseGeneral(
          features=(self.num_heads, head_dim), use_bias=self.use_bias,
          dtype=self.dtype, param_dtype=self.param_dtype, dot_general=dot_general,
          kernel_init=partitioning.logical(self.kernel_init, ('embed', 'heads', 'head_dim')),
          bias_init=partitioning.logical(self.bias_init, ('heads', 'head_dim')),
          name=name)

    query = projection('query')(inputs_q)  # (B, T, N, H)
    kernel = resolve_attention_impl(self.implementation, dtype=query.dtype,
                                    matmul=self.matmul)
    if self.decode and not self_attention:
      key, value = self._cross_attention_cache(inputs_kv, projection)
    else:
      key = projection('key')(inputs_kv)  # (B, S, N, H)
      value = projection('value')(inputs_kv)  # (B, S, N, H)

    if self.decode and self_attention:
      key, value, cache_mask = self._update_cache(key, value)
      mask = combine_masks(mask, cache_mask)
    elif causal:
      mask = combine_masks(mask, make_causal_mask(query.shape[1]))

    dropout_rng = None
    if self.dropout_rate > 0.0 and not deterministic:
      dropout_rng = self.make_rng('dropout')
    weights = None
    if dropout_rng is not None and kernel != 'plain' and kernel not in DROPOUT_NOTED:
      DROPOUT_NOTED.add(kernel)
      logging.warning('Attention dropout (rate %s) runs on the plain attention path in '
                      'training: %r has no dropout.', self.dropout_rate, kernel)
    if kernel == 'plain' or return_weights or dropout_rng is not None:
      out, weights = plain_attention(query, key, value, mask,
                                     dropout_rate=self.dropout_rate,
                                     dropout_rng=dropout_rng)
      self.sow('intermediates', 'attention_weights', weights)
    elif kernel == 'chunked':
      out = chunked_attention(query, key, value, mask, chunk_size=self.attention_chunk_size)
    elif kernel == 'blas' and mask is None and query.dtype == jnp.float32:
      out = blas.attention(query, key, value)
    elif kernel in ('head_major', 'blas'):
      out = head_major_attention(query, key, value, mask)
    else:
      out = fused_attention(query, key, value, mask, cudnn=kernel == 'cudnn')

    out = nn.DenseGeneral(
        features=self.out_features or inputs_q.shape[-1], axis=(-2, -1),
        use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
        dot_general=dot_general,
        kernel_init=partitioning.logical(self.kernel_init, ('heads', 'head_dim', 'embed')),
        bias_init=partitioning.logical(self.bias_init, ('embed',)),
        name='out')(out)  # (B, T, D_out)
    return (out, weights) if return_weights else out

  def _cross_attention_cache(self, inputs_kv: Array,
                             projection: Callable[[str], nn.Module]) -> tuple[Array, Array]:
    """Cross-attention keys/values (B, S, N, H) while decoding, projected only once.

    The first call after `init` projects `inputs_kv` and stores the result in the
    cache; later calls read it back. `init` itself stores nothing: its cache
    would hold the projections of its own random parameters.
    """
    if self.has_variable('cache', CROSS_ATTENTION_CACHE[0]):
      key, value = (self.get_variable('cache', name) for name in CROSS_ATTENTION_CACHE)
      if key.shape[:2] != inputs_kv.shape[:2]:
        raise ValueError(
            'The cache holds cross-attention keys/values for (batch, length) '
            f'{key.shape[:2]}, but inputs_kv has {inputs_kv.shape[:2]}; start '
            'from a new cache for new inputs.')
      return key, value
    key, value = projection('key')(inputs_kv), projection('value')(inputs_kv)
    if not self.is_initializing():
      for name, x in zip(CROSS_ATTENTION_CACHE, (key, value)):
        self.put_variable('cache', name, x)
    return key, value

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
