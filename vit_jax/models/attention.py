"""Multi-head dot-product attention: masks, the attention implementations, the module.

Shapes use these letters: B batch, T query length, S key/value length,
N heads, H head_dim, D model width.

The module's `implementation` names the kernel (`KERNELS`): 'fused'
(`jax.nn.dot_product_attention`, XLA), 'plain' (returns and sows the weights),
'chunked' (memory linear in S, `attention_chunked`), one added with `register_kernel`,
or 'auto' (the default), which `resolve_attention_impl` turns into the fastest kernel
for the backend and dtype at trace time.
"""

import contextlib
import contextvars
import functools
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import partitioning
from vit_jax.models.masks import (combine_masks, make_causal_mask, make_padding_mask,  # noqa: F401
                                  make_segment_mask)
from vit_jax.models.attention_chunked import chunked_attention

Array = jax.Array
Dtype = Any
# A kernel: fn(query (B, T, N, H), key (B, S, N, H), value (B, S, N, H), mask) -> (B, T, N, H).
Kernel = Callable[[Array, Array, Array, Array | None], Array]
# Kernels whose training already said that attention dropout moved it to 'plain'.
DROPOUT_NOTED: set[str] = set()

# What a model may ask for; the other entries of `KERNELS` are what 'auto' picks.
ATTENTION_IMPLEMENTATIONS = ['auto', 'fused', 'plain', 'chunked']
# Asked in order by 'auto' before the built-in choice: fn(backend, dtype) -> a kernel or None.
_AUTO_CHOICES: list[Callable[[str, Dtype], str | None]] = []
# Kernels that want sequences padded to a multiple of a length: cuDNN's flash attention
# has no gradient for odd lengths. `padded_length` says how long; `layers.Encoder` pads
# its tokens once and masks the padding out, rather than each layer padding q/k/v.
_LENGTH_MULTIPLES: dict[str, int] = {'cudnn': 2}
# The backend 'auto' chooses for inside `target_backend`; None: `jax.default_backend()`.
_TARGET_BACKEND = contextvars.ContextVar('vit_jax_attention_backend', default=None)
# Cache entries of cross-attention while decoding: the projected keys/values of the
# encoder output, the same at every step (and for every beam of one example).
CROSS_ATTENTION_CACHE = ('cross_key', 'cross_value')


def resolve_attention_impl(implementation: str, *, backend: str | None = None,
                           dtype: Dtype = jnp.float32) -> str:
  """The kernel that `implementation` runs on `backend` for inputs of `dtype`.

  'auto' becomes what a registered `auto_choice` says, else 'cudnn' (cuDNN flash
  attention through `jax.nn.dot_product_attention`) on GPUs for float16/bfloat16,
  'head_major' (`head_major_attention`, the fastest formulation on XLA:CPU) on CPUs,
  and 'fused' (XLA) otherwise. Other implementations stay as they are.

  Args:
    implementation: one of `ATTENTION_IMPLEMENTATIONS`.
    backend: 'cpu', 'gpu', 'tpu', ...; default: the one `target_backend` sets, else
      `jax.default_backend()`.
    dtype: the dtype of the queries and keys.
  """
  if implementation not in ATTENTION_IMPLEMENTATIONS:
    raise errors.ConfigError(f'Unknown attention implementation {implementation!r}; '
                             f'choose one of {tuple(ATTENTION_IMPLEMENTATIONS)}.')
  if implementation != 'auto':
    return implementation
  backend = backend or _TARGET_BACKEND.get() or jax.default_backend()
  for choice in _AUTO_CHOICES:
    kernel = choice(backend, jnp.dtype(dtype))
    if kernel is not None:
      return kernel
  if backend == 'cpu':
    return 'head_major'
  if backend == 'gpu' and jnp.dtype(dtype) in (jnp.float16, jnp.bfloat16):
    return 'cudnn'
  return 'fused'


@contextlib.contextmanager
def target_backend(backend: str):
  """Models traced inside choose their 'auto' kernels for `backend` ('gpu', ...), not
  this machine's: for compiling for a device that is not here."""
  token = _TARGET_BACKEND.set(backend)
  try:
    yield
  finally:
    _TARGET_BACKEND.reset(token)


def register_kernel(name: str, kernel: Kernel, *,
                    auto_choice: Callable[[str, Dtype], bool] | None = None,
                    length_multiple: int = 1):
  """Adds attention kernel `name`, which models may then ask for by name.

  `auto_choice(backend, dtype)`, if given, says where 'auto' should pick it;
  `length_multiple`, what sequence lengths the kernel wants (see `padded_length`).
  Registering a name again replaces the kernel.
  """
  KERNELS[name] = kernel
  _LENGTH_MULTIPLES[name] = length_multiple
  if name not in ATTENTION_IMPLEMENTATIONS:
    ATTENTION_IMPLEMENTATIONS.append(name)
  if auto_choice is not None:
    _AUTO_CHOICES.append(lambda backend, dtype: name if auto_choice(backend, dtype) else None)


def padded_length(implementation: str, length: int, *, dtype: Dtype = jnp.float32) -> int:
  """The length to pad unmasked sequences of `length` tokens to for `implementation`."""
  multiple = _LENGTH_MULTIPLES.get(resolve_attention_impl(implementation, dtype=dtype), 1)
  return -(-length // multiple) * multiple


def attention_kernel(implementation: str, *, dtype: Dtype,
                     chunk_size: int = 512) -> tuple[str, Kernel]:
  """The resolved name of `implementation` for `dtype` inputs, and its kernel."""
  name = resolve_attention_impl(implementation, dtype=dtype)
  if name == 'chunked':
    return name, functools.partial(chunked_attention, chunk_size=chunk_size)
  return name, KERNELS[name]


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
  unmasked odd lengths run padded to even lengths with the padding masked out by
  sequence lengths; masked odd lengths use XLA. (`layers.Encoder` pads its tokens once,
  ViT's 197 to 198, so that its layers call this with even lengths.)
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


# Each kernel by name (see `Kernel`); `register_kernel` adds more.
KERNELS: dict[str, Kernel] = {
    'fused': fused_attention,
    'cudnn': functools.partial(fused_attention, cudnn=True),
    'plain': lambda query, key, value, mask: plain_attention(query, key, value, mask)[0],
    'chunked': chunked_attention,
    'head_major': head_major_attention,
}


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
  implementation: str = 'auto'  # 'auto' or a kernel of KERNELS (see the top).
  attention_chunk_size: int = 512  # Keys per step of the 'chunked' implementation.
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

    # Logical axis names: tensor parallelism splits 'heads' (vit_jax.train.mesh).
    def projection(name):
      return nn.DenseGeneral(
          features=(self.num_heads, head_dim), use_bias=self.use_bias,
          dtype=self.dtype, param_dtype=self.param_dtype,
          kernel_init=partitioning.logical(self.kernel_init, ('embed', 'heads', 'head_dim')),
          bias_init=partitioning.logical(self.bias_init, ('heads', 'head_dim')),
          name=name)

    query = projection('query')(inputs_q)  # (B, T, N, H)
    kernel, attend = attention_kernel(self.implementation, dtype=query.dtype,
                                      chunk_size=self.attention_chunk_size)
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
    else:
      out = attend(query, key, value, mask)

    out = nn.DenseGeneral(
        features=self.out_features or inputs_q.shape[-1], axis=(-2, -1),
        use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
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
