"""Where the CPU kernels enter the models: the context manager `use`.

The models of `vit_jax.models` are plain Flax: their Dense layers multiply with XLA, and
attention runs a kernel of `vit_jax.models.attention.KERNELS`. Importing `vit_jax.kernels`
registers one more there, 'blas' (`blas.attention` for unmasked float32 inputs, else
'head_major'), and inside `with use(matmul):`

- every `nn.Dense` and `nn.DenseGeneral` whose products `matmul` puts on the BLAS
  (`blas.resolve_matmul`) multiplies through `blas.dot_general`;
- attention 'auto' picks 'blas' for float32 on CPUs where the products are on the BLAS.

The choice is made while a function is traced, so a jitted function keeps what it was
first traced with. The trainer and the benchmark run inside `use(config.matmul)`.
"""

import contextlib
import contextvars

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.kernels import blas
from vit_jax.models import attention

# The `matmul` option of the innermost `use`; None outside.
_MATMUL = contextvars.ContextVar('vit_jax_matmul', default=None)


@contextlib.contextmanager
def use(matmul: str = 'auto'):
  """Runs the models traced inside on the BLAS where `matmul` says so ('auto', 'xla', 'blas').

  'blas' raises `blas.KernelUnavailable` here, with the reason, if it cannot run.
  """
  blas.resolve_matmul(matmul)
  token = _MATMUL.set(matmul)
  try:
    with nn.intercept_methods(_products_on_blas):
      yield
  finally:
    _MATMUL.reset(token)


def products_on_blas(dtype=jnp.float32) -> bool:
  """Whether the Dense layers of `dtype` traced here multiply on the BLAS."""
  matmul = _MATMUL.get()
  return matmul is not None and blas.resolve_matmul(matmul, dtype=dtype) == 'blas'


def _products_on_blas(next_fun, args, kwargs, context):
  """Flax interceptor: a Dense layer with XLA's product gets `blas.dot_general` instead."""
  layer = context.module
  if (context.method_name == '__call__' and isinstance(layer, (nn.Dense, nn.DenseGeneral))
      and layer.dot_general is None and layer.dot_general_cls is None
      and products_on_blas(layer.dtype or jnp.result_type(*jax.tree.leaves(args)))):
    # Layers are frozen dataclasses; the product is swapped for this one call only.
    object.__setattr__(layer, 'dot_general', blas.dot_general)
    try:
      return next_fun(*args, **kwargs)
    finally:
      object.__setattr__(layer, 'dot_general', None)
  return next_fun(*args, **kwargs)


def _blas_attention(query, key, value, mask):
  """`blas.attention` where it applies (unmasked float32), else head-major attention."""
  if mask is None and query.dtype == jnp.float32:
    return blas.attention(query, key, value)
  return attention.head_major_attention(query, key, value, mask)


attention.register_kernel(
    'blas', _blas_attention,
    auto_choice=lambda backend, dtype: (backend == 'cpu' and dtype == jnp.float32
                                        and products_on_blas(dtype)))
