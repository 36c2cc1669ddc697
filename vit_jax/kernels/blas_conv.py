"""Convolutions on the BLAS: a drop-in for `lax.conv_general_dilated` that Flax's `nn.Conv`
accepts (the Python side of `conv.cc`).

XLA:CPU computes convolutions with its own kernels, and a bfloat16 one in float32 around
conversions. `conv_general_dilated` instead multiplies on the BLAS that the Dense layers use
(`blas.matmul`): a 1x1 convolution is a product of the (strided) pixels with the kernel, on
the BLAS forward and backward; a larger one gathers each panel of output pixels' input
patches in cache and multiplies them (`conv.cc`), and so do its kernel's gradient (the
patches' transpose times the output's gradient) and, for stride 1, its input's gradient (a
convolution with the kernel flipped); a strided convolution's input gradient is XLA's.
Handled: NHWC inputs, HWIO kernels, zero padding, no dilation, one feature group, float32
(and bfloat16 where `blas.has_bfloat16_products`); anything else goes to
`lax.conv_general_dilated` unchanged.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vit_jax.kernels import blas

# A panel's patches and float32 products are kept within this many bytes (in the cache).
_PANEL_BYTES = 1 << 19
_NHWC = ('NHWC', 'HWIO', 'NHWC')


def _is_nhwc(lhs, rhs, dimension_numbers) -> bool:
  if dimension_numbers is None or lhs.ndim != 4 or rhs.ndim != 4:
    return False
  return (lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
          == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC))


def _undilated(dilation) -> bool:
  return dilation is None or all(d == 1 for d in np.atleast_1d(dilation))


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides, padding,
                         lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
                         feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None) -> jax.Array:
  """`lax.conv_general_dilated`, on the BLAS where it is a plain NHWC/HWIO convolution."""
  supported = (
      _is_nhwc(lhs, rhs, dimension_numbers) and lhs.dtype == rhs.dtype
      and feature_group_count == 1 and batch_group_count == 1
      and _undilated(lhs_dilation) and _undilated(rhs_dilation)
      and preferred_element_type in (None, lhs.dtype)
      and (lhs.dtype == jnp.float32
           or (lhs.dtype == jnp.bfloat16 and blas.has_bfloat16_products())))
  if supported:
    strides = tuple(int(s) for s in window_strides)
    pads = (lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], strides, padding)
            if isinstance(padding, str) else padding)
    pads = tuple((int(low), int(high)) for low, high in pads)
    supported = all(low >= 0 and high >= 0 for low, high in pads)
  if not supported:
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
        feature_group_count=feature_group_count, batch_group_count=batch_group_count,
        precision=precision, preferred_element_type=preferred_element_type)
  if rhs.shape[:2] == (1, 1) and pads == ((0, 0), (0, 0)):
    pixels = lhs[:, ::strides[0], ::strides[1]]  # (batch, out_h, out_w, in)
    out = blas.matmul(pixels.reshape(-1, lhs.shape[3]), rhs.reshape(rhs.shape[2:]))
    return out.reshape(pixels.shape[:3] + rhs.shape[3:])
  return _conv(lhs, rhs, strides, pads)


def _as_xla(lhs, rhs, strides, pads):
  return lax.conv_general_dilated(lhs, rhs, strides, pads, dimension_numbers=_NHWC)


def _panel_rows(depth: int, features: int, itemsize: int) -> int:
  """Output pixels a thread multiplies at a time: their patches (depth each) and float32
  products within `_PANEL_BYTES`; a multiple of 16, from 16 to 512."""
  rows = _PANEL_BYTES // (depth * itemsize + features * 4)
  return int(min(512, max(16, rows // 16 * 16)))


def _attributes(kernel_shape, dtype, strides, pads) -> dict:
  kh, kw, channels, features = kernel_shape
  return dict(stride_h=np.int64(strides[0]), stride_w=np.int64(strides[1]),
              pad_top=np.int64(pads[0][0]), pad_left=np.int64(pads[1][0]),
              panel_rows=np.int64(_panel_rows(kh * kw * channels, features,
                                              jnp.dtype(dtype).itemsize)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(lhs, rhs, strides, pads):
  """lhs (B, H, W, C) conv rhs (KH, KW, C, F) on `conv.cc`: (B, OH, OW, F)."""
  blas.load()  # Registers the FFI targets (once), or says why they cannot run here.
  out = jax.eval_shape(lambda a, b: _as_xla(a, b, strides, pads), lhs, rhs)
  bfloat16 = lhs.dtype == jnp.bfloat16
  call = jax.ffi.ffi_call(blas.CONV_BF16_TARGET if bfloat16 else blas.CONV_TARGET, out,
                          vmap_method='sequential')
  return call(lhs, rhs, **_attributes(rhs.shape, lhs.dtype, strides, pads))


def _weight_gradient(lhs, d_out, kernel_shape, strides, pads):
  """The gradient of `_conv`'s rhs (kernel_shape, lhs's dtype) on `conv.cc`."""
  bfloat16 = lhs.dtype == jnp.bfloat16
  call = jax.ffi.ffi_call(
      blas.CONV_WEIGHT_GRAD_BF16_TARGET if bfloat16 else blas.CONV_WEIGHT_GRAD_TARGET,
      jax.ShapeDtypeStruct(kernel_shape, jnp.float32), vmap_method='sequential')
  return call(lhs, d_out, **_attributes(kernel_shape, lhs.dtype, strides, pads)).astype(
      lhs.dtype)


def _input_gradient(lhs, rhs, d_out, strides, pads):
  """The gradient of `_conv`'s lhs: for stride 1, the convolution of d_out with the kernel
  flipped in space and transposed (on `conv.cc`); else XLA's transpose of the convolution."""
  kh, kw = rhs.shape[:2]
  flipped_pads = tuple((k - 1 - low, k - 1 - high) for k, (low, high) in zip((kh, kw), pads))
  if strides == (1, 1) and all(low >= 0 and high >= 0 for low, high in flipped_pads):
    flipped = rhs[::-1, ::-1].transpose(0, 1, 3, 2)  # (KH, KW, F, C)
    return _conv(d_out, flipped, strides, flipped_pads)
  d_lhs, = jax.linear_transpose(lambda a: _as_xla(a, rhs, strides, pads), lhs)(d_out)
  return d_lhs


def _conv_fwd(lhs, rhs, strides, pads):
  # Symbolic zeros: the residuals say which inputs are differentiated, so that no unused
  # gradient (the images' in a train step) is traced.
  out = _conv(lhs.value, rhs.value, strides, pads)
  return out, (lhs.value, rhs.value, () if lhs.perturbed else None,
               () if rhs.perturbed else None)


def _conv_bwd(strides, pads, residuals, grad):
  lhs, rhs, lhs_perturbed, rhs_perturbed = residuals
  grad = grad.astype(lhs.dtype)
  d_lhs = d_rhs = None
  if lhs_perturbed is not None:
    d_lhs = _input_gradient(lhs, rhs, grad, strides, pads)
  if rhs_perturbed is not None:
    d_rhs = _weight_gradient(lhs, grad, rhs.shape, strides, pads)
  return d_lhs, d_rhs


_conv.defvjp(_conv_fwd, _conv_bwd, symbolic_zeros=True)
