"""Where the fast kernels enter the models: the context manager `use`.

The models of `vit_jax.models` are plain Flax: their Dense layers multiply with XLA,
attention runs a kernel of `vit_jax.models.attention.KERNELS`, and dropout draws its masks
with `jax.random.bernoulli`. Importing `vit_jax.kernels` registers one more attention
kernel, 'blas' (`blas_attention` for float32 and bfloat16 inputs whose mask, if any, is
the same for every head, else 'head_major'), and
inside `with use(matmul, dropout):`

- every `nn.Dense` and `nn.DenseGeneral` whose products `matmul` puts on the BLAS
  (`blas.resolve_matmul`) multiplies through `blas.dot_general`, and so does
  `nn.Embed.attend` (a tied output projection);
- attention 'auto' picks 'blas' on CPUs where the products are on the BLAS (float32 on
  Intel CPUs with MKL, and bfloat16 there with AMX), and for float32 on AMD CPUs with MKL,
  where the products stay on XLA (`blas.attention_on_blas`);
- every other bfloat16 Dense layer with a bias traced for a CPU adds it through
  `bias.add_bias` (its gradient summed in float32, where autodiff sums in bfloat16);
- with `dropout='hash'`, every `nn.Dropout` draws its masks from `dropout.bernoulli`
  (a counter hash; the same keep probability, far cheaper than threefry on CPUs);
- where MKL multiplies bfloat16 with its packed product, every bfloat16 Dense layer with a
  bias runs in one kernel with its bias (`blas_dense.dense_bfloat16`; differentiated, Flax's
  layer with its bias gradient summed in float32), a `layers.MlpBlock`
  without dropout with its activation in the first, and ViT's patch embedding (a convolution
  whose strides equal its kernel) as one such product of the patches
  (`blas_dense.patch_embedding_bfloat16`);
- every other `nn.Conv` (the hybrid's ResNet stem) whose dtype multiplies on the BLAS
  convolves through `blas_conv.conv_general_dilated`, and every `nn.GroupNorm` with Flax's
  defaults there normalises in `group_norm.group_norm` (two passes over memory each way),
  every such `nn.LayerNorm` in `layer_norm.layer_norm` (each row read twice each way).

The choice is made while a function is traced, so a jitted function keeps what it was
first traced with. The trainer and the benchmark run inside
`use(config.matmul, config.dropout_masks)`.
"""

import contextlib
import contextvars
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.kernels import blas, blas_attention, blas_conv, blas_dense, dropout as dropout_lib
from vit_jax.kernels import bias as bias_lib, group_norm, layer_norm
from vit_jax.models import attention, layers
from vit_jax.models.backend import traced_backend

DROPOUT_MASKS = ('hash', 'jax')
# The `matmul` option of the innermost `use`; None outside.
_MATMUL = contextvars.ContextVar('vit_jax_matmul', default=None)


@contextlib.contextmanager
def use(matmul: str = 'auto', dropout: str = 'hash'):
  """Runs the models traced inside on the fast kernels that the options choose.

  Args:
    matmul: who multiplies float32 (and, with MKL, bfloat16) Dense layers: 'auto', 'xla' or
      'blas'. 'blas' raises `blas.KernelUnavailable` here, with the reason, if it cannot run.
    dropout: where dropout masks come from: 'hash' (`dropout.bernoulli`) or 'jax'
      (`jax.random.bernoulli`, as plain Flax).
  """
  blas.resolve_matmul(matmul)
  if dropout not in DROPOUT_MASKS:
    raise errors.ConfigError(f'Unknown dropout masks {dropout!r}; choose one of '
                             f'{DROPOUT_MASKS}.')
  token = _MATMUL.set(matmul)
  try:
    with contextlib.ExitStack() as stack:
      stack.enter_context(nn.intercept_methods(_products_on_blas))
      stack.enter_context(nn.intercept_methods(_bias_gradient_in_float32))
      stack.enter_context(nn.intercept_methods(_mlp_in_dense_kernels))
      stack.enter_context(nn.intercept_methods(_patch_embedding_in_dense_kernel))
      stack.enter_context(nn.intercept_methods(_convolutions_on_blas))
      stack.enter_context(nn.intercept_methods(_group_norm_in_kernel))
      stack.enter_context(nn.intercept_methods(_layer_norm_in_kernel))
      stack.enter_context(nn.intercept_methods(_embedding_attend_on_blas))
      if dropout == 'hash':
        stack.enter_context(nn.intercept_methods(_hashed_dropout))
      yield
  finally:
    _MATMUL.reset(token)


def products_on_blas(dtype=jnp.float32) -> bool:
  """Whether the Dense layers of `dtype` traced here multiply on the BLAS."""
  matmul = _MATMUL.get()
  return matmul is not None and blas.resolve_matmul(matmul, dtype=dtype) == 'blas'


def _products_on_blas(next_fun, args, kwargs, context):
  """Flax interceptor: a Dense layer with XLA's product gets `blas.dot_general` instead, or,
  in bfloat16 with a bias where `blas_dense` runs, `blas_dense.dense_bfloat16` for the whole
  layer."""
  layer = context.module
  if not (context.method_name == '__call__' and isinstance(layer, (nn.Dense, nn.DenseGeneral))
          and layer.dot_general is None and layer.dot_general_cls is None
          and products_on_blas(layer.dtype or jnp.result_type(*jax.tree.leaves(args)))):
    return next_fun(*args, **kwargs)
  params = _dense_params(layer, args)
  if params is not None:
    return blas_dense.dense_bfloat16(args[0], params['kernel'], params['bias'])
  return _call_with(layer, 'dot_general', blas.dot_general, next_fun, args, kwargs)


def _call_with(module, field, value, next_fun, args, kwargs):
  """`next_fun(*args, **kwargs)` with `module.field` set to `value` for this one call
  (modules are frozen dataclasses)."""
  previous = getattr(module, field)
  object.__setattr__(module, field, value)
  try:
    return next_fun(*args, **kwargs)
  finally:
    object.__setattr__(module, field, previous)


def _bias_gradient_in_float32(next_fun, args, kwargs, context):
  """Flax interceptor: a bfloat16 Dense or DenseGeneral (no batch axes) with a bias, traced
  for a CPU, adds its bias through `bias.add_bias` (its gradient summed in float32). Entered
  after `_products_on_blas`: the layers it leaves to Flax come here, on the BLAS or not."""
  layer = context.module
  if not (context.method_name == '__call__' and type(layer) in (nn.Dense, nn.DenseGeneral)
          and len(args) == 1 and not kwargs and layer.use_bias
          and layer.dtype is not None and jnp.dtype(layer.dtype) == jnp.bfloat16
          and not getattr(layer, 'batch_dims', ()) and traced_backend() == 'cpu'):
    return next_fun(*args, **kwargs)
  params = nn.meta.unbox(layer.variables.get('params', {}))
  if 'bias' not in params:  # Being initialised.
    return next_fun(*args, **kwargs)
  y = _call_with(layer, 'use_bias', False, next_fun, args, kwargs)
  return bias_lib.add_bias(y, params['bias'].astype(layer.dtype))


def _convolutions_on_blas(next_fun, args, kwargs, context):
  """Flax interceptor: an `nn.Conv` (or subclass: the hybrid's `StdConv`) whose dtype
  multiplies on the BLAS convolves with `blas_conv.conv_general_dilated` instead of XLA's.
  Entered after `_patch_embedding_in_dense_kernel`, which takes its convolutions first."""
  conv = context.module
  if not (context.method_name == '__call__' and isinstance(conv, nn.Conv)
          and conv.conv_general_dilated is None and conv.conv_general_dilated_cls is None
          and products_on_blas(conv.dtype or jnp.result_type(*jax.tree.leaves(args)))):
    return next_fun(*args, **kwargs)
  return _call_with(conv, 'conv_general_dilated', blas_conv.conv_general_dilated, next_fun,
                    args, kwargs)


def _group_norm_in_kernel(next_fun, args, kwargs, context):
  """Flax interceptor: an `nn.GroupNorm` with Flax's defaults (a scale and a bias, float32
  statistics, the fast variance, over all positions), its params bound and its dtype's
  products on the BLAS, runs `group_norm.group_norm` with them (and its gradient)."""
  norm = context.module
  if not (context.method_name == '__call__' and type(norm) is nn.GroupNorm and len(args) == 1
          and jnp.ndim(args[0]) >= 2 and kwargs.get('mask') is None and set(kwargs) <= {'mask'}):
    return next_fun(*args, **kwargs)
  x = args[0]
  groups = norm.num_groups if norm.group_size is None else x.shape[-1] // norm.group_size
  if not (norm.dtype is not None and jnp.dtype(norm.dtype) == x.dtype
          and x.dtype in (jnp.float32, jnp.bfloat16) and norm.use_bias and norm.use_scale
          and norm.reduction_axes is None and norm.axis_name is None
          and norm.use_fast_variance and norm.force_float32_reductions
          and groups and x.shape[-1] % groups == 0 and products_on_blas(x.dtype)):
    return next_fun(*args, **kwargs)
  params = nn.meta.unbox(norm.variables.get('params', {}))
  if 'scale' not in params or 'bias' not in params:  # Being initialised.
    return next_fun(*args, **kwargs)
  return group_norm.group_norm(x, params['scale'], params['bias'], groups, norm.epsilon)


def _layer_norm_in_kernel(next_fun, args, kwargs, context):
  """Flax interceptor: an `nn.LayerNorm` with Flax's defaults (over the last axis, a scale
  and a bias, float32 statistics, the fast variance), its dtype its input's, its params bound
  and that dtype's products on the BLAS, runs `layer_norm.layer_norm` with them (and its
  gradient)."""
  norm = context.module
  if not (context.method_name == '__call__' and type(norm) is nn.LayerNorm and len(args) == 1
          and jnp.ndim(args[0]) >= 2 and kwargs.get('mask') is None and set(kwargs) <= {'mask'}):
    return next_fun(*args, **kwargs)
  x = args[0]
  if not (norm.dtype is not None and jnp.dtype(norm.dtype) == x.dtype
          and x.dtype in (jnp.float32, jnp.bfloat16) and norm.use_bias and norm.use_scale
          and norm.reduction_axes in (-1, (-1,), x.ndim - 1, (x.ndim - 1,))
          and norm.feature_axes in (-1, (-1,), x.ndim - 1, (x.ndim - 1,))
          and norm.axis_name is None and norm.use_fast_variance
          and norm.force_float32_reductions and products_on_blas(x.dtype)):
    return next_fun(*args, **kwargs)
  params = nn.meta.unbox(norm.variables.get('params', {}))
  if 'scale' not in params or 'bias' not in params:  # Being initialised.
    return next_fun(*args, **kwargs)
  return layer_norm.layer_norm(x, params['scale'], params['bias'], norm.epsilon)


def _embedding_attend_on_blas(next_fun, args, kwargs, context):
  """Flax interceptor: `nn.Embed.attend` (the seq2seq Transformer's tied output projection)
  multiplies through `blas.dot_general` where the Dense layers of its dtype do."""
  module = context.module
  if not (context.method_name == 'attend' and type(module) is nn.Embed and len(args) == 1
          and not kwargs):
    return next_fun(*args, **kwargs)
  query, table = module.promote_dtype(args[0], module.embedding, dtype=module.dtype)
  if not products_on_blas(query.dtype):
    return next_fun(*args, **kwargs)
  # (..., features) x (num_embeddings, features) over the features: (..., num_embeddings).
  return blas.dot_general(query, table, (((query.ndim - 1,), (1,)), ((), ())))


def _dense_params(layer, args) -> dict | None:
  """The bound kernel and bias of a bfloat16 Dense or DenseGeneral (trailing axes contracted,
  no batch axes) that `blas_dense.dense_bfloat16` computes here; None for any other layer."""
  if not (type(layer) in (nn.Dense, nn.DenseGeneral) and len(args) == 1
          and layer.dtype is not None and jnp.dtype(layer.dtype) == jnp.bfloat16
          and layer.use_bias):
    return None
  if isinstance(layer, nn.DenseGeneral):
    axes = (layer.axis,) if isinstance(layer.axis, int) else tuple(layer.axis)
    rank = jnp.ndim(args[0])
    if layer.batch_dims or tuple(a % rank for a in axes) != tuple(
        range(rank - len(axes), rank)):
      return None
  params = _params_for_dense_kernels(layer)
  return params if 'kernel' in params and 'bias' in params else None


def _params_for_dense_kernels(module) -> dict:
  """`module`'s bound params (unboxed) where `blas_dense` computes the bfloat16 layers traced
  here; {} elsewhere, and while the params are being initialised."""
  if not (products_on_blas(jnp.bfloat16) and blas_dense.available()):
    return {}
  return nn.meta.unbox(module.variables.get('params', {}))


def _mlp_in_dense_kernels(next_fun, args, kwargs, context):
  """Flax interceptor: a bfloat16 `layers.MlpBlock` without dropout, its products on MKL's
  packed bfloat16 product and its params bound, runs `blas_dense.dense_bfloat16` for each of
  its two Dense layers (`Dense_0` with the activation), the params Flax would use."""
  block = context.module
  if context.method_name != '__call__' or type(block) is not layers.MlpBlock:
    return next_fun(*args, **kwargs)
  deterministic = kwargs.get('deterministic', True)
  if not (len(args) == 1 and jnp.dtype(block.dtype) == jnp.bfloat16
          and block.activation is not None and block.activation in blas_dense.ACTIVATIONS
          and (deterministic is True or block.dropout_rate == 0)):
    return next_fun(*args, **kwargs)
  params = _params_for_dense_kernels(block)
  dense = [params.get(f'Dense_{i}', {}) for i in range(2)]
  if not all('kernel' in d and 'bias' in d for d in dense):
    return next_fun(*args, **kwargs)
  hidden = blas_dense.dense_bfloat16(args[0], dense[0]['kernel'], dense[0]['bias'],
                                     block.activation)
  return blas_dense.dense_bfloat16(hidden, dense[1]['kernel'], dense[1]['bias'])


def _patch_embedding_in_dense_kernel(next_fun, args, kwargs, context):
  """Flax interceptor: a bfloat16 `nn.Conv` whose strides equal its kernel, padding 'VALID'
  (ViT's patch embedding), its products on MKL's packed bfloat16 product and its params bound,
  runs `blas_dense.patch_embedding_bfloat16` with them."""
  conv = context.module
  if context.method_name != '__call__' or type(conv) is not nn.Conv:
    return next_fun(*args, **kwargs)
  kernel_size = tuple(conv.kernel_size)
  strides = (conv.strides,) * 2 if isinstance(conv.strides, int) else tuple(conv.strides or ())
  if not (len(args) == 1 and not kwargs and jnp.ndim(args[0]) == 4 and len(kernel_size) == 2
          and conv.dtype is not None and jnp.dtype(conv.dtype) == jnp.bfloat16
          and conv.use_bias and conv.mask is None and conv.padding == 'VALID'
          and strides == kernel_size and conv.conv_general_dilated is None
          and conv.conv_general_dilated_cls is None
          and conv.input_dilation in (None, 1, (1, 1))
          and conv.kernel_dilation in (None, 1, (1, 1)) and conv.feature_group_count == 1):
    return next_fun(*args, **kwargs)
  params = _params_for_dense_kernels(conv)
  if 'kernel' not in params or 'bias' not in params:
    return next_fun(*args, **kwargs)
  return blas_dense.patch_embedding_bfloat16(args[0], params['kernel'], params['bias'])


def _hashed_dropout(next_fun, args, kwargs, context):
  """Flax interceptor: `nn.Dropout` with its masks from `dropout.bernoulli`.

  The rest is `nn.Dropout.__call__`: the same arguments, rng and scaling.
  """
  layer = context.module
  if context.method_name != '__call__' or type(layer) is not nn.Dropout:
    return next_fun(*args, **kwargs)
  bound = _DROPOUT_SIGNATURE.bind(*args, **kwargs)
  inputs, deterministic, rng = (bound.arguments.get(name) for name in
                                ('inputs', 'deterministic', 'rng'))
  deterministic = nn.merge_param('deterministic', layer.deterministic, deterministic)
  if not 0 <= layer.rate <= 1:
    raise ValueError(f'nn.Dropout(rate={layer.rate}): a dropout rate must be in [0, 1).')
  if layer.rate == 0.0 or deterministic or layer.rate == 1.0:
    return next_fun(*args, **kwargs)
  keep = 1.0 - layer.rate
  if rng is None:
    rng = layer.make_rng(layer.rng_collection)
  shape = [1 if i in layer.broadcast_dims else n for i, n in enumerate(inputs.shape)]
  mask = jnp.broadcast_to(dropout_lib.bernoulli(rng, keep, tuple(shape)), inputs.shape)
  return jax.lax.select(mask, inputs / keep, jnp.zeros_like(inputs))


_DROPOUT_SIGNATURE = inspect.signature(
    lambda inputs, deterministic=None, rng=None: None)


def _blas_attention(query, key, value, mask):
  """`blas_attention` where it applies (float32 or bfloat16, any mask the same for every
  head), else head-major attention."""
  rows = None if mask is None else blas_attention.mask_rows(mask, query.shape, key.shape)
  if mask is not None and rows is None:
    return attention.head_major_attention(query, key, value, mask)
  if query.dtype == jnp.float32:
    return blas_attention.attention(query, key, value, rows)
  if query.dtype == jnp.bfloat16:
    return blas_attention.attention_bfloat16(query, key, value, rows)
  return attention.head_major_attention(query, key, value, mask)


def attention_on_blas(dtype=jnp.float32) -> bool:
  """Whether attention 'auto' traced here runs `blas_attention` (`blas.attention_on_blas`)."""
  matmul = _MATMUL.get()
  return matmul is not None and blas.attention_on_blas(matmul, dtype=dtype)


attention.register_kernel(
    'blas', _blas_attention,
    auto_choice=lambda backend, dtype: (backend == 'cpu'
                                        and dtype in (jnp.float32, jnp.bfloat16)
                                        and attention_on_blas(dtype)))
