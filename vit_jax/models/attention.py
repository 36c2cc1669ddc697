"""Multi-head dot-product attention: the table of kernels, how 'auto' picks one, the module.

Shapes use these letters: B batch, T query length, S key/value length,
N heads, H head_dim, D model width.

The module's `implementation` names the kernel (`KERNELS`; the built-in ones are in
`attention_kernels`): 'fused' (`jax.nn.dot_product_attention`, XLA; 'cudnn' is its cuDNN
call), 'plain' (returns and sows the weights),
'chunked' (memory linear in S, `attention_chunked`), one added with `register_kernel`,
or 'auto' (the default), which `resolve_attention_impl` turns into the fastest kernel
for the backend and dtype at trace time.
"""

import functools
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import partitioning
from vit_jax.models.backend import traced_backend
from vit_jax.models.masks import (KeyPadding, combine_masks, make_causal_mask,  # noqa: F401
                                  make_padding_mask, make_segment_mask)
from vit_jax.models.attention_chunked import chunked_attention
from vit_jax.models.attention_kernels import (dot_product_attention_weights,  # noqa: F401
                                              fused_attention, head_major_attention,
                                              plain_attention)

Array = jax.Array
Dtype = Any
# A kernel: fn(query (B, T, N, H), key (B, S, N, H), value (B, S, N, H), mask) -> (B, T, N, H),
# where mask is a boolean array or None (or a `KeyPadding` for `_TAKE_KEY_PADDING`).
Kernel = Callable[[Array, Array, Array, Array | None], Array]
# Kernels whose training already said that attention dropout moved it to 'plain'.
DROPOUT_NOTED: set[str] = set()

# What a model may ask for; the other entries of `KERNELS` are what 'auto' picks.
ATTENTION_IMPLEMENTATIONS = ['auto', 'fused', 'plain', 'chunked']
# Asked in order by 'auto' before the built-in choice: fn(backend, dtype) -> a kernel or None.
_AUTO_CHOICES: list[Callable[[str, Dtype], str | None]] = []
# Kernels that want sequences padded to a multiple of a length: cuDNN's flash attention
# has no gradient for odd lengths. `padded_length` says how long; `layers.Encoder` pads
# its tokens once and hides the padding with a `KeyPadding`, rather than each layer
# padding q/k/v.
_LENGTH_MULTIPLES: dict[str, int] = {'cudnn': 2}
# Kernels that take a `KeyPadding` as it is (the others get it as a boolean mask):
# `fused_attention` passes it on as key lengths, which cuDNN applies without a bias.
_TAKE_KEY_PADDING = frozenset({'fused', 'cudnn'})
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
    backend: 'cpu', 'gpu', 'tpu', ...; default: `vit_jax.models.backend.traced_backend()`.
    dtype: the dtype of the queries and keys.
  """
  if implementation not in ATTENTION_IMPLEMENTATIONS:
    raise errors.ConfigError(f'Unknown attention implementation {implementation!r}; '
                             f'choose one of {tuple(ATTENTION_IMPLEMENTATIONS)}.')
  if implementation != 'auto':
    return implementation
  backend = backend or traced_backend()
  for choice in _AUTO_CHOICES:
    kernel = choice(backend, jnp.dtype(dtype))
    if kernel is not None:
      return kernel
  if backend == 'cpu':
    return 'head_major'
  if backend == 'gpu' and jnp.dtype(dtype) in (jnp.float16, jnp.bfloat16):
    return 'cudnn'
  return 'fused'


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
      mask: bool, broadcastable to (B, N, T, S); True = attend. Or a `KeyPadding`.
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

    order_mask = None  # What the position order hides: future keys.
    if self.decode and self_attention:
      key, value, order_mask = self._update_cache(key, value)
    elif causal:
      order_mask = make_causal_mask(query.shape[1])

    dropout_rng = None
    if self.dropout_rate > 0.0 and not deterministic:
      dropout_rng = self.make_rng('dropout')
    runs_plain = kernel == 'plain' or return_weights or dropout_rng is not None
    if isinstance(mask, KeyPadding) and (
        runs_plain or kernel not in _TAKE_KEY_PADDING or order_mask is not None):
      mask = mask.as_mask(key.shape[1])  # (1, 1, 1, S)
    if order_mask is not None:
      mask = combine_masks(mask, order_mask)

    weights = None
    if dropout_rng is not None and kernel != 'plain' and kernel not in DROPOUT_NOTED:
      DROPOUT_NOTED.add(kernel)
      logging.warning('Attention dropout (rate %s) runs on the plain attention path in '
                      'training: %r has no dropout.', self.dropout_rate, kernel)
    if runs_plain:
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
