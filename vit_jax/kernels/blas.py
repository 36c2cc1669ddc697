"""Float32 matrix products and attention on a CPU BLAS (MKL or OpenBLAS), from XLA:CPU.

XLA:CPU multiplies float32 matrices with its own kernels (YNNPACK, Eigen). On
Intel CPUs MKL is faster on the shapes of ViT layers, and it reads transposed
or strided operands in place, where XLA copies them (before the weight-gradient
products, and into head-major order for attention). This module compiles
the kernels of `SOURCES` with the system C++ compiler (once per machine and jaxlib
version, into a cache directory: `build`), registers them as XLA FFI targets and builds on them:

- `matmul(a, b)`: a 2-D product with its own gradient (no transposed copies);
- `dot_general`: a drop-in for `lax.dot_general` that Flax `Dense` and
  `DenseGeneral` accept; products it cannot express fall back to XLA;
- the FFI targets of the other kernels, which `blas_attention`, `blas_dense`, `blas_conv`
  and `group_norm` (in `vit_jax.kernels`) call;
- `resolve_matmul`: what the option `matmul` of `vit_jax.kernels.use` ('auto',
  'xla', 'blas') means on this machine for the products, `attention_on_blas` for
  attention.

The BLAS is MKL's `libmkl_rt` where installed (`pip install 'vit_jax[mkl]'`),
else the OpenBLAS inside NumPy's wheels; `VIT_JAX_BLAS=/path/to/libmkl_rt.so`
(or another ILP64 CBLAS) chooses one. `VIT_JAX_CACHE` moves the cache
(default `~/.cache/vit_jax`).
"""

import ctypes
import ctypes.util
import functools
import glob
import math
import os
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vit_jax import errors
from vit_jax.kernels import build
from vit_jax.kernels.build import KernelUnavailable

MATMUL_IMPLEMENTATIONS = ('auto', 'xla', 'blas')
SOURCES = ('gemm.cc', 'attention.cc', 'attention_bf16.cc', 'dense.cc', 'conv.cc',
           'group_norm.cc', 'layer_norm.cc')
HEADERS = ('attention.h', 'blas.h', 'parallel_for.h', 'vector_math.h')
GEMM_TARGET = 'vit_jax_gemm_f32'
GEMM_BF16_TARGET = 'vit_jax_gemm_bf16'  # bfloat16 operands, float32 result (MKL only).
# bfloat16 activation(x @ w + bias), bfloat16 result, forward only (MKL's packed product).
DENSE_BF16_TARGET = 'vit_jax_dense_bf16'
# The products (out (M, N) = op(a) (M, K) @ op(b); `transpose_a` attribute if any).
GEMM_TARGETS = (GEMM_TARGET, GEMM_BF16_TARGET, DENSE_BF16_TARGET)
# Convolutions: out (B, OH, OW, F) = x (B, H, W, C) conv w (KH, KW, C, F).
CONV_TARGET = 'vit_jax_conv_f32'
CONV_BF16_TARGET = 'vit_jax_conv_bf16'  # MKL only.
# The weight gradient: x and d_out -> float32 (KH, KW, C, F).
CONV_WEIGHT_GRAD_TARGET = 'vit_jax_conv_weight_grad_f32'
CONV_WEIGHT_GRAD_BF16_TARGET = 'vit_jax_conv_weight_grad_bf16'
CONV_TARGETS = (CONV_TARGET, CONV_BF16_TARGET, CONV_WEIGHT_GRAD_TARGET,
                CONV_WEIGHT_GRAD_BF16_TARGET)
# GroupNorm: x (B, S, C), float32 scale and bias (C,) -> (out, mean, rstd); its backward pass.
GROUP_NORM_TARGET = 'vit_jax_group_norm_f32'
GROUP_NORM_BF16_TARGET = 'vit_jax_group_norm_bf16'
GROUP_NORM_BACKWARD_TARGET = 'vit_jax_group_norm_bwd_f32'
GROUP_NORM_BACKWARD_BF16_TARGET = 'vit_jax_group_norm_bwd_bf16'
GROUP_NORM_TARGETS = (GROUP_NORM_TARGET, GROUP_NORM_BF16_TARGET, GROUP_NORM_BACKWARD_TARGET,
                      GROUP_NORM_BACKWARD_BF16_TARGET)
# LayerNorm over the last axis: x (R, C), float32 scale and bias (C,) -> (out, mean, rstd).
LAYER_NORM_TARGET = 'vit_jax_layer_norm_f32'
LAYER_NORM_BF16_TARGET = 'vit_jax_layer_norm_bf16'
LAYER_NORM_BACKWARD_TARGET = 'vit_jax_layer_norm_bwd_f32'
LAYER_NORM_BACKWARD_BF16_TARGET = 'vit_jax_layer_norm_bwd_bf16'
ATTENTION_FORWARD_TARGET = 'vit_jax_attention_fwd_f32'  # Also returns the weights.
ATTENTION_INFERENCE_TARGET = 'vit_jax_attention_f32'  # Forward only: no weights kept.
ATTENTION_BACKWARD_TARGET = 'vit_jax_attention_bwd_f32'
# bfloat16 inputs (MKL only): forward only; forward with float32 weights; backward.
ATTENTION_INFERENCE_BF16_TARGET = 'vit_jax_attention_bf16'
ATTENTION_FORWARD_BF16_TARGET = 'vit_jax_attention_fwd_bf16'
ATTENTION_BACKWARD_BF16_TARGET = 'vit_jax_attention_bwd_bf16'
ATTENTION_TARGETS = (ATTENTION_FORWARD_TARGET, ATTENTION_INFERENCE_TARGET,
                     ATTENTION_BACKWARD_TARGET, ATTENTION_INFERENCE_BF16_TARGET,
                     ATTENTION_FORWARD_BF16_TARGET, ATTENTION_BACKWARD_BF16_TARGET)


class Blas(NamedTuple):
  name: str  # 'mkl' or 'openblas'.
  path: str  # The shared library.
  sgemm_symbol: str  # Its ILP64 CBLAS sgemm.
  threads_symbol: str | None = None  # Sets this thread's BLAS threads (MKL).
  bf16_symbol: str | None = None  # Its ILP64 bfloat16 x bfloat16 -> float32 gemm (MKL).
  # The same product with one operand packed first: (pack size, pack, compute) (MKL).
  bf16_pack_symbols: tuple[str, str, str] | None = None


def _mkl(path: str) -> Blas:
  return Blas('mkl', path, 'cblas_sgemm_64', 'MKL_Set_Num_Threads_Local',
              'cblas_gemm_bf16bf16f32_64',
              tuple(f'cblas_gemm_bf16bf16f32_{part}_64' for part in
                    ('pack_get_size', 'pack', 'compute')))


def _openblas(path: str) -> Blas:  # The build inside NumPy's wheels (symbols prefixed).
  return Blas('openblas', path, 'scipy_cblas_sgemm64_')


def _blas_candidates() -> list[Blas]:
  """Libraries to try, best first: VIT_JAX_BLAS, MKL, NumPy's OpenBLAS."""
  chosen = os.environ.get('VIT_JAX_BLAS')
  if chosen:
    return [_mkl(chosen) if 'mkl' in os.path.basename(chosen) else _openblas(chosen)]
  candidates = []
  for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
    candidates += [_mkl(path) for path in
                   sorted(glob.glob(os.path.join(prefix, 'lib', 'libmkl_rt.so*')))]
  if ctypes.util.find_library('mkl_rt'):
    candidates.append(_mkl(ctypes.util.find_library('mkl_rt')))
  numpy_libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), 'numpy.libs')
  candidates += [_openblas(path) for path in
                 sorted(glob.glob(os.path.join(numpy_libs, 'libscipy_openblas64_*.so')))]
  return candidates


def _find_blas() -> tuple[Blas, ctypes.CDLL]:
  # MKL's OpenMP threads otherwise spin for a while after each product, taking the
  # cores from XLA's threads between the products.
  # Read when MKL's OpenMP runtime starts; a value set by the user wins.
  os.environ.setdefault('KMP_BLOCKTIME', '0')
  tried = []
  for blas in _blas_candidates():
    try:
      library = ctypes.CDLL(blas.path)
      getattr(library, blas.sgemm_symbol)
      if blas.threads_symbol and not hasattr(library, blas.threads_symbol):
        blas = blas._replace(threads_symbol=None)
      if blas.bf16_symbol and not hasattr(library, blas.bf16_symbol):
        blas = blas._replace(bf16_symbol=None)
      if not (blas.bf16_symbol and blas.bf16_pack_symbols
              and all(hasattr(library, symbol) for symbol in blas.bf16_pack_symbols)):
        blas = blas._replace(bf16_pack_symbols=None)
      return blas, library
    except (OSError, AttributeError) as error:
      tried.append(f'{blas.path}: {error}')
  raise KernelUnavailable(
      'No ILP64 CBLAS found (tried: ' + ('; '.join(tried) or 'nothing to try') + '). '
      "Install MKL with `pip install 'vit_jax[mkl]'`, point VIT_JAX_BLAS at an MKL "
      "libmkl_rt.so, or use matmul='xla' (--config.matmul=xla).")


@functools.cache
def _mkl_found() -> bool:
  """Whether the BLAS the kernels would call is MKL: found (loaded), not built."""
  try:
    blas, _ = _find_blas()
  except KernelUnavailable:
    return False
  return blas.name == 'mkl'


@functools.cache
def _load() -> tuple[Blas | None, str | None]:
  """Builds, loads and registers the kernels once; (blas, None) or (None, why not)."""
  try:
    blas, blas_library = _find_blas()
    here = os.path.dirname(os.path.abspath(__file__))
    kernels = ctypes.CDLL(build.build([os.path.join(here, s) for s in SOURCES],
                                 [os.path.join(here, h) for h in HEADERS]))
    pointer = lambda symbol: ctypes.cast(  # noqa: E731
        getattr(blas_library, symbol) if symbol else None, ctypes.c_void_p)
    kernels.vit_jax_set_blas(pointer(blas.sgemm_symbol), pointer(blas.threads_symbol),
                             pointer(blas.bf16_symbol),
                             *map(pointer, blas.bf16_pack_symbols or (None,) * 3))
    handlers = {
        GEMM_TARGET: 'GemmF32', GEMM_BF16_TARGET: 'GemmBf16', DENSE_BF16_TARGET: 'DenseBf16',
        ATTENTION_FORWARD_TARGET: 'AttentionForwardF32',
        ATTENTION_INFERENCE_TARGET: 'AttentionInferenceF32',
        ATTENTION_BACKWARD_TARGET: 'AttentionBackwardF32',
        ATTENTION_INFERENCE_BF16_TARGET: 'AttentionInferenceBf16',
        ATTENTION_FORWARD_BF16_TARGET: 'AttentionForwardBf16',
        ATTENTION_BACKWARD_BF16_TARGET: 'AttentionBackwardBf16',
        CONV_TARGET: 'ConvF32', CONV_BF16_TARGET: 'ConvBf16',
        CONV_WEIGHT_GRAD_TARGET: 'ConvWeightGradF32',
        CONV_WEIGHT_GRAD_BF16_TARGET: 'ConvWeightGradBf16',
        GROUP_NORM_TARGET: 'GroupNormF32', GROUP_NORM_BF16_TARGET: 'GroupNormBf16',
        GROUP_NORM_BACKWARD_TARGET: 'GroupNormBackwardF32',
        GROUP_NORM_BACKWARD_BF16_TARGET: 'GroupNormBackwardBf16',
        LAYER_NORM_TARGET: 'LayerNormF32', LAYER_NORM_BF16_TARGET: 'LayerNormBf16',
        LAYER_NORM_BACKWARD_TARGET: 'LayerNormBackwardF32',
        LAYER_NORM_BACKWARD_BF16_TARGET: 'LayerNormBackwardBf16'}
    for target, handler in handlers.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(kernels, f'VitJax{handler}')),
                                  platform='cpu')
    _LIBRARIES.extend([blas_library, kernels])  # Keep both loaded for the process.
    return blas, None
  except KernelUnavailable as error:
    return None, str(error)


_LIBRARIES: list[ctypes.CDLL] = []


def load() -> Blas:
  """The BLAS the kernels call, after building and registering them if needed.

  Raises:
    KernelUnavailable: JAX runs on another backend, no compiler, no BLAS, or the
      build failed (the message says).
  """
  backend = jax.default_backend()
  if backend != 'cpu':
    raise KernelUnavailable(
        f"The BLAS kernels run on CPUs, and JAX's default backend here is {backend!r}. "
        "Use matmul='auto' or 'xla' and attention_impl='auto' (or run on the CPU with "
        'JAX_PLATFORMS=cpu).')
  blas, reason = _load()
  if blas is None:
    raise KernelUnavailable(reason)
  return blas


def _cpu_vendor() -> str:
  """The CPU's vendor_id ('GenuineIntel', 'AuthenticAMD'), or '' where it cannot be read."""
  return build.cpuinfo().get('vendor_id', '')


def _cpu_has_amx() -> bool:
  """Whether the CPU multiplies bfloat16 matrices on AMX tiles (its flags say amx_bf16)."""
  return 'amx_bf16' in build.cpuinfo().get('flags', '').split()


def _auto_runs_mkl(dtype, vendor: str) -> bool:
  """Whether 'auto' may run MKL here: on a single CPU device of `vendor`, with MKL installed
  (found first, so that nothing is built without it), float32, or bfloat16 where the CPU has
  AMX and MKL its bfloat16 gemm."""
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.float32, jnp.bfloat16) or _cpu_vendor() != vendor:
    return False
  if dtype == jnp.bfloat16 and not _cpu_has_amx():
    return False
  if jax.default_backend() != 'cpu' or jax.device_count() != 1 or not _mkl_found():
    return False
  blas = _load()[0]  # MKL's kernels built and loaded.
  return blas is not None and (dtype == jnp.float32 or blas.bf16_symbol is not None)


def resolve_matmul(matmul: str, *, dtype=jnp.float32) -> str:
  """'xla' or 'blas': what the option `matmul` runs here for `dtype` inputs.

  'auto' is 'blas' where it was measured faster than XLA: float32 on a single
  Intel CPU device with MKL installed, and bfloat16 there on CPUs with AMX.
  Elsewhere (other CPUs, OpenBLAS, several devices, where the FFI call would not
  be partitioned, GPUs, bfloat16 without AMX) it is 'xla'. 'blas' insists, and
  raises `KernelUnavailable` if it cannot run.
  """
  if matmul not in MATMUL_IMPLEMENTATIONS:
    raise errors.ConfigError(f'Unknown matmul implementation {matmul!r}; choose one of '
                             f'{MATMUL_IMPLEMENTATIONS}.')
  if matmul == 'blas':
    load()
    return 'blas'
  if matmul == 'xla':
    return 'xla'
  return 'blas' if _auto_runs_mkl(dtype, 'GenuineIntel') else 'xla'


def attention_on_blas(matmul: str, *, dtype=jnp.float32) -> bool:
  """Whether attention 'auto' runs `blas_attention.attention` here, under the option `matmul`.

  Where the products are on the BLAS (`resolve_matmul`), attention is too. On AMD CPUs,
  'auto' keeps the products on XLA's kernels and runs attention alone on MKL: there a train
  step was measured faster that way than on XLA alone or on MKL alone, and inference no
  slower (README, Benchmarks). Float32 on a single CPU device with MKL installed, as for
  the products; an explicit `matmul='xla'` keeps attention on XLA too.
  """
  if resolve_matmul(matmul, dtype=dtype) == 'blas':
    return True
  return matmul == 'auto' and _auto_runs_mkl(dtype, 'AuthenticAMD')


def _gemm(a: jax.Array, b: jax.Array, transpose_a: bool = False,
          transpose_b: bool = False) -> jax.Array:
  rows = a.shape[1] if transpose_a else a.shape[0]
  cols = b.shape[0] if transpose_b else b.shape[1]
  load()  # Registers the FFI targets (once), or says why they cannot run here.
  target = GEMM_BF16_TARGET if a.dtype == jnp.bfloat16 else GEMM_TARGET
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                          vmap_method='sequential')
  return call(a, b, transpose_a=transpose_a, transpose_b=transpose_b).astype(a.dtype)


def has_bfloat16_products() -> bool:
  """Whether `matmul` takes bfloat16 operands here (MKL's cblas_gemm_bf16bf16f32)."""
  return load().bf16_symbol is not None


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
  """a (M, K) @ b (K, N) on the BLAS; reverse-mode differentiable.

  Both float32, or both bfloat16 (where `has_bfloat16_products`): accumulated in float32
  and rounded to bfloat16, as XLA's bfloat16 products are.
  """
  return _product(a, b, False)


def matmul_transposed(a: jax.Array, b: jax.Array) -> jax.Array:
  """a (M, K) @ b (N, K)^T on the BLAS, which reads b transposed in place; as `matmul`
  otherwise (a tied output projection: the activations times the embedding table)."""
  return _product(a, b, True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _product(a, b, transpose_b: bool):
  return _gemm(a, b, transpose_b=transpose_b)


def _product_fwd(a, b, transpose_b):
  return _gemm(a, b, transpose_b=transpose_b), (a, b)


def _product_bwd(transpose_b, residuals, grad):
  a, b = residuals  # The BLAS reads the transposes in place.
  if transpose_b:  # d a = grad (M, N) @ b (N, K);  d b = grad^T (N, M) @ a (M, K).
    return _gemm(grad, b), _gemm(grad, a, transpose_a=True)
  # d a = grad (M, N) @ b^T;  d b = a^T @ grad (K, N).
  return _gemm(grad, b, transpose_b=True), _gemm(a, grad, transpose_a=True)


_product.defvjp(_product_fwd, _product_bwd)


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
                preferred_element_type=None, **kwargs) -> jax.Array:
  """`lax.dot_general` that sends 'flatten and multiply' products to the BLAS: float32, and
  bfloat16 where `has_bfloat16_products`.

  Handled: no batch dimensions, the contracted dimensions are the trailing ones
  of `lhs` and the leading ones of `rhs`, in order (every Dense/DenseGeneral in
  the vit_jax models), or `lhs`'s last with a 2-D `rhs`'s last (`nn.Embed.attend`).
  Anything else goes to `lax.dot_general` unchanged.
  """
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_contract, rhs_contract = tuple(lhs_contract), tuple(rhs_contract)
  count = len(lhs_contract)
  supported = (
      not lhs_batch and not rhs_batch and not kwargs and lhs.dtype == rhs.dtype
      and preferred_element_type in (None, lhs.dtype)
      and (lhs.dtype == jnp.float32
           or (lhs.dtype == jnp.bfloat16 and has_bfloat16_products()))
      and lhs_contract == tuple(range(lhs.ndim - count, lhs.ndim)))
  if supported and rhs.ndim == 2 and count == 1 and rhs_contract == (1,):
    out = matmul_transposed(lhs.reshape(-1, rhs.shape[1]), rhs)
    return out.reshape(lhs.shape[:-1] + rhs.shape[:1])
  if not (supported and rhs_contract == tuple(range(count))):
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type, **kwargs)
  contracted = math.prod(rhs.shape[:count])
  out = matmul(lhs.reshape(-1, contracted), rhs.reshape(contracted, -1))
  return out.reshape(lhs.shape[:lhs.ndim - count] + rhs.shape[count:])
