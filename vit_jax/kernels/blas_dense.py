"""bfloat16 Dense layers for inference on MKL, the bias and the activation in the product's
epilogue: the Python side of `dense.cc`.

XLA:CPU gets the float32 result of each bfloat16 product on the BLAS (`blas.matmul`) and
then adds the bias and applies the activation in a separate pass over memory, rounding to
bfloat16 on the way. `dense_bfloat16` instead multiplies panels of rows and applies the bias
and the activation to each panel's float32 product while it is in cache, rounding once.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.kernels import blas, blas_conv
from vit_jax.kernels.bias import add_bias
from vit_jax.models import layers

# The activations the kernel applies, with their codes in `dense.cc` (None: none). 'gelu'
# is Flax's `nn.gelu`, the tanh form.
ACTIVATIONS = {None: 0, 'gelu': 1, 'relu': 2}
# Rows of x a thread multiplies at a time: their float32 products stay in its cache.
_PANEL_ROWS = 128


def available() -> bool:
  """Whether `dense_bfloat16` runs its kernel here: MKL with its packed bfloat16 product."""
  return blas.load().bf16_pack_symbols is not None


def _contract(x, kernel, bias):
  """x (..., *C) with kernel (*C, *F), bias (*F): the contracted dimensions' count."""
  return kernel.ndim - bias.ndim


def _as_layer(x, kernel, bias, activation):
  """The layer as Flax computes it inside `seam.use`: Dense's product (on the BLAS) and bias
  in bfloat16, then the activation as `layers.MlpBlock` applies it; the bias gradient
  summed in float32 (`bias.add_bias`)."""
  count = _contract(x, kernel, bias)
  dimensions = ((tuple(range(x.ndim - count, x.ndim)), tuple(range(count))), ((), ()))
  y = add_bias(blas.dot_general(x, kernel, dimensions), bias)
  return y if activation is None else jax.checkpoint(layers.activation_fn(activation))(y)


def dense_bfloat16(x: jax.Array, kernel: jax.Array, bias: jax.Array,
                   activation: str | None = None) -> jax.Array:
  """activation(x @ kernel + bias) in bfloat16: x (..., *C), kernel (*C, *F), bias (*F), as
  Flax's `Dense` and `DenseGeneral` (trailing axes contracted) hold them.

  Undifferentiated, on `dense.cc`: the product accumulated in float32, the bias added and
  the activation applied in float32, rounded once to bfloat16 (Flax's bfloat16 Dense rounds
  the product, then the sum, then the activation). Differentiated, the layer as Flax
  computes it, with its gradient (the bias's summed in float32). The caller checks
  `available()`.
  """
  if activation not in ACTIVATIONS:
    raise ValueError(f'dense_bfloat16: unknown activation {activation!r}; '
                     f'choose one of {sorted(ACTIVATIONS, key=str)}.')
  return _dense(*(a.astype(jnp.bfloat16) for a in (x, kernel, bias)), activation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _dense(x, kernel, bias, activation):
  """`dense_bfloat16` of bfloat16 arrays."""
  blas.load()
  count = _contract(x, kernel, bias)
  inner = math.prod(kernel.shape[:count])
  rows = x.reshape(-1, inner)  # (tokens, prod C)
  out_shape = (rows.shape[0], math.prod(bias.shape))
  call = jax.ffi.ffi_call(blas.DENSE_BF16_TARGET,
                          jax.ShapeDtypeStruct(out_shape, jnp.bfloat16),
                          vmap_method='sequential')
  out = call(rows, kernel.reshape(inner, -1), bias.reshape(-1),
             activation=np.int32(ACTIVATIONS[activation]), panel_rows=np.int64(_PANEL_ROWS))
  return out.reshape(x.shape[:x.ndim - count] + bias.shape)


def _vjp_of_perturbed(layer, *primals):
  """A custom_vjp forward rule (symbolic zeros): `layer`'s output, and residuals for the
  gradients of the inputs being differentiated only, so that no unused gradient (the
  images' in a train step) is traced."""
  values = [p.value for p in primals]
  perturbed = [p.perturbed for p in primals]

  def of_perturbed(*differentiated):
    given = iter(differentiated)
    return layer(*(next(given) if d else v for v, d in zip(values, perturbed)))
  out, pullback = jax.vjp(of_perturbed, *(v for v, d in zip(values, perturbed) if d))
  return out, (pullback, tuple(() if d else None for d in perturbed))


def _cotangents(residuals, d_out):
  """The backward rule to `_vjp_of_perturbed`: None (zero) for the inputs not differentiated."""
  pullback, differentiated = residuals
  given = iter(pullback(d_out))
  return tuple(None if d is None else next(given) for d in differentiated)


def _dense_fwd(x, kernel, bias, activation):
  return _vjp_of_perturbed(lambda *a: _as_layer(*a, activation), x, kernel, bias)


def _dense_bwd(activation, residuals, d_out):
  return _cotangents(residuals, d_out)


_dense.defvjp(_dense_fwd, _dense_bwd, symbolic_zeros=True)


def patch_embedding_bfloat16(images: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """A bfloat16 convolution whose strides equal its kernel (ViT's patch embedding, padding
  'VALID'), as `dense_bfloat16` of the patches: images (B, H, W, C), kernel (P, Q, C, D), bias
  (D,) -> (B, H // P, W // Q, D).

  Undifferentiated, the patches are cut out and multiplied in `dense.cc` (XLA:CPU computes a
  bfloat16 convolution in float32); differentiated, the convolution on the BLAS
  (`blas_conv`) with Flax's bias add, and their gradients.
  """
  return _patch_embedding(*(a.astype(jnp.bfloat16) for a in (images, kernel, bias)))


def _as_conv(images, kernel, bias):
  """`nn.Conv(features, kernel_size=strides=(P, Q), padding='VALID')` of bfloat16 arrays, as
  `seam.use` computes it without this kernel: convolved on the BLAS (`blas_conv`, whose
  kernel gradient is a BLAS product too), the bias added by Flax."""
  numbers = jax.lax.conv_dimension_numbers(images.shape, kernel.shape, ('NHWC', 'HWIO', 'NHWC'))
  y = blas_conv.conv_general_dilated(images, kernel, kernel.shape[:2], 'VALID',
                                     lhs_dilation=(1, 1), rhs_dilation=(1, 1),
                                     dimension_numbers=numbers, feature_group_count=1)
  return y + bias.reshape(1, 1, 1, -1)


@jax.custom_vjp
def _patch_embedding(images, kernel, bias):
  """`patch_embedding_bfloat16` of bfloat16 arrays."""
  batch, height, width, channels = images.shape
  p, q = kernel.shape[:2]
  rows, cols = height // p, width // q
  patches = images[:, :rows * p, :cols * q].reshape(batch, rows, p, cols, q, channels)
  patches = patches.transpose(0, 1, 3, 2, 4, 5)  # (B, rows, cols, P, Q, C)
  patches = patches.reshape(batch, rows, cols, p * q * channels)
  return _dense(patches, kernel.reshape(p * q * channels, -1), bias, None)


def _patch_embedding_fwd(images, kernel, bias):
  return _vjp_of_perturbed(_as_conv, images, kernel, bias)


_patch_embedding.defvjp(_patch_embedding_fwd, _cotangents, symbolic_zeros=True)
