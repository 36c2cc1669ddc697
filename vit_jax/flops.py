"""Multiply-adds of a traced function: matrix products, convolutions, BLAS and cuDNN calls."""

import math
from typing import Any, Callable

import jax
from jax.extend import core as jex_core

from vit_jax.kernels import blas


def _dot_general_flops(eqn) -> int:
  lhs, rhs = (v.aval.shape for v in eqn.invars)
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params['dimension_numbers']
  batch = math.prod(lhs[d] for d in lhs_batch)
  contract = math.prod(lhs[d] for d in lhs_contract)
  lhs_free = math.prod(s for d, s in enumerate(lhs) if d not in (*lhs_contract, *lhs_batch))
  rhs_free = math.prod(s for d, s in enumerate(rhs) if d not in (*rhs_contract, *rhs_batch))
  return batch * lhs_free * rhs_free * contract


def _conv_flops(eqn) -> int:
  kernel = eqn.invars[1].aval.shape
  out = eqn.outvars[0].aval.shape
  rhs_spec = eqn.params['dimension_numbers'].rhs_spec  # (out_ch, in_ch, *spatial)
  per_output = math.prod(kernel[d] for d in rhs_spec[1:])  # in_ch/groups * kh * kw
  return math.prod(out) * per_output


def _blas_gemm_flops(eqn) -> int:
  """A `vit_jax.kernels.blas` product: out (M, N), op(a) (M, K)."""
  a_shape = eqn.invars[0].aval.shape
  transpose_a = dict(eqn.params['attributes']).get('transpose_a', False)
  contract = a_shape[0] if transpose_a else a_shape[1]
  return math.prod(eqn.outvars[0].aval.shape) * contract


def _blas_conv_flops(eqn) -> int:
  """A `vit_jax.kernels.blas_conv` convolution (out (B, OH, OW, F), kernel (KH, KW, C, F)) or
  its weight gradient (x, d_out (B, OH, OW, F) -> (KH, KW, C, F))."""
  if eqn.params['target_name'] in (blas.CONV_WEIGHT_GRAD_TARGET,
                                   blas.CONV_WEIGHT_GRAD_BF16_TARGET):
    return math.prod(eqn.invars[1].aval.shape[:3]) * math.prod(eqn.outvars[0].aval.shape)
  return math.prod(eqn.outvars[0].aval.shape) * math.prod(eqn.invars[1].aval.shape[:3])


def _blas_attention_flops(eqn) -> int:
  """`vit_jax.kernels.blas_attention`: q k^T and p v (forward), four products (backward)."""
  batch, queries, heads, head_dim = eqn.invars[0].aval.shape
  keys = eqn.invars[1].aval.shape[1]
  backward = (blas.ATTENTION_BACKWARD_TARGET, blas.ATTENTION_BACKWARD_BF16_TARGET)
  products = 4 if eqn.params['target_name'] in backward else 2
  return products * batch * heads * queries * keys * head_dim


# cuDNN flash attention (`jax.nn.dot_product_attention(implementation='cudnn')`):
# primitive -> matrix products per head (q k^T and p v forward; four backward, as XLA's
# gradient of the same attention has, not counting cuDNN's recomputation).
_CUDNN_ATTENTION_PRODUCTS = {'dot_product_attention_fwd_wrapper': 2,
                             'dot_product_attention_bwd_wrapper': 4}
_CUDNN_LAYOUT_BNTH = 1  # jax._src.cudnn.fused_attention_stablehlo.AttentionLayout.BNTH


def _cudnn_attention_flops(eqn) -> int:
  query, _, value = (v.aval.shape for v in eqn.invars[:3])
  if eqn.params['layout'] == _CUDNN_LAYOUT_BNTH:
    (batch, heads, queries, head_dim), keys = query, value[2]
  else:
    (batch, queries, heads, head_dim), keys = query, value[1]
  products = _CUDNN_ATTENTION_PRODUCTS[eqn.primitive.name]
  return products * batch * heads * queries * keys * head_dim


def _sub_jaxprs(value: Any):
  """The jaxprs held in one equation parameter (a jaxpr, or a tuple of them)."""
  items = value if isinstance(value, (tuple, list)) else (value,)
  for item in items:
    if isinstance(item, jex_core.ClosedJaxpr):
      yield item.jaxpr
    elif isinstance(item, jex_core.Jaxpr):
      yield item


def _jaxpr_flops(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == 'dot_general':
      total += _dot_general_flops(eqn)
    elif name == 'conv_general_dilated':
      total += _conv_flops(eqn)
    elif name == 'ffi_call' and eqn.params['target_name'] in blas.GEMM_TARGETS:
      total += _blas_gemm_flops(eqn)
    elif name == 'ffi_call' and eqn.params['target_name'] in blas.CONV_TARGETS:
      total += _blas_conv_flops(eqn)
    elif name == 'ffi_call' and eqn.params['target_name'] in blas.ATTENTION_TARGETS:
      total += _blas_attention_flops(eqn)
    elif name in _CUDNN_ATTENTION_PRODUCTS:
      total += _cudnn_attention_flops(eqn)
    elif name == 'cond':
      total += max(_jaxpr_flops(j) for j in _sub_jaxprs(eqn.params['branches']))
    else:
      inner = sum(_jaxpr_flops(j) for v in eqn.params.values() for j in _sub_jaxprs(v))
      total += inner * eqn.params.get('length', 1) if name == 'scan' else inner
  return total


def count_flops(fn: Callable, *args, **kwargs) -> int:
  """Multiply-adds of all matrix products and convolutions in `fn(*args, **kwargs)`.

  Products and attention on the BLAS (`vit_jax.kernels.blas`) and cuDNN's flash
  attention count like XLA's.

  One multiply-add counts as one FLOP (fvcore's convention). Counted on the
  traced jaxpr, so nothing runs; `args` may be arrays or `jax.ShapeDtypeStruct`s.
  Scans count their body once per iteration; a `while` loop body, whose trip
  count is unknown, counts once; a `cond` counts its most expensive branch.
  """
  closed = jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
  return _jaxpr_flops(closed.jaxpr)
