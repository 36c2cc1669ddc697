"""Convolutions on the BLAS (vit_jax.kernels.blas_conv): XLA's values and gradients, the
hybrid's ResNet stem on the BLAS inside `kernels.use`, and XLA for what it does not handle."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from vit_jax import flops, kernels, models
from vit_jax.kernels import blas, blas_conv

try:
  BLAS = blas.load()
except blas.KernelUnavailable as error:  # No compiler or no BLAS on this machine.
  pytest.skip(f'BLAS kernels unavailable: {error}', allow_module_level=True)

NHWC = ('NHWC', 'HWIO', 'NHWC')
DTYPES = [jnp.float32] + ([jnp.bfloat16] if BLAS.bf16_symbol else [])
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _the_same_inputs_whatever_ran_before():
  RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


def _operands(x_shape, kernel_shape, dtype=jnp.float32):
  depth = np.prod(kernel_shape[:3])
  x = jnp.asarray(RNG.standard_normal(x_shape), dtype)
  kernel = jnp.asarray(RNG.standard_normal(kernel_shape) / np.sqrt(depth), dtype)
  return x, kernel


def _xla(x, kernel, strides, padding):
  return lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=NHWC)


def _ours(x, kernel, strides, padding):
  return blas_conv.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=NHWC)


# The hybrid's shapes in small (the root's 7x7 stride 2 on 3 channels, 3x3 and 1x1 strided),
# odd sizes whose patches reach into the padding on one side only, explicit and 'VALID'
# padding, and a kernel as wide as the image.
CASES = [
    ((2, 20, 20, 3), (7, 7, 3, 8), (2, 2), 'SAME'),
    ((2, 9, 9, 8), (3, 3, 8, 16), (1, 1), 'SAME'),
    ((2, 9, 11, 8), (3, 3, 8, 16), (2, 2), 'SAME'),
    ((3, 8, 8, 16), (1, 1, 16, 8), (1, 1), 'SAME'),
    ((3, 9, 8, 16), (1, 1, 16, 24), (2, 2), 'SAME'),
    ((1, 10, 7, 5), (3, 2, 5, 4), (1, 2), ((2, 0), (1, 3))),
    ((2, 12, 12, 3), (4, 4, 3, 6), (4, 4), 'VALID'),
    ((1, 5, 5, 2), (5, 5, 2, 3), (1, 1), 'SAME'),
]


@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize('x_shape,kernel_shape,strides,padding', CASES)
def test_convolution_equals_xlas(dtype, x_shape, kernel_shape, strides, padding):
  x, kernel = _operands(x_shape, kernel_shape, dtype)
  ours = jax.jit(lambda a, b: _ours(a, b, strides, padding))
  jaxpr = str(jax.make_jaxpr(ours)(x, kernel))
  assert 'conv_general_dilated' not in jaxpr
  assert any(target in jaxpr for target in (*blas.CONV_TARGETS, *blas.GEMM_TARGETS))
  got = np.asarray(ours(x, kernel), np.float32)
  want = np.asarray(_xla(x.astype(jnp.float32), kernel.astype(jnp.float32), strides, padding))
  assert got.shape == want.shape and got.dtype == np.float32
  assert ours(x, kernel).dtype == dtype
  # float32: the same sums in another order; bfloat16: each output rounded once.
  tolerance = 1e-5 if dtype == jnp.float32 else 2 ** -8
  np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())


@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_panels_that_do_not_divide_the_rows(monkeypatch, dtype):
  """Small panels (16 rows) over 2 x 9 x 9 = 162 output pixels: ten full, one of 2."""
  monkeypatch.setattr(blas_conv, '_PANEL_BYTES', 1)
  x, kernel = _operands((2, 9, 9, 8), (3, 3, 8, 16), dtype)
  got = jax.jit(lambda a, b: _ours(a, b, (1, 1), 'SAME'))(x, kernel)
  want = _xla(x.astype(jnp.float32), kernel.astype(jnp.float32), (1, 1), 'SAME')
  tolerance = 1e-5 if dtype == jnp.float32 else 2 ** -8
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tolerance,
                             atol=tolerance * np.abs(want).max())


# Stride 1 (both gradients on conv.cc: the input's a convolution with the kernel flipped) and
# strided (the input's gradient XLA's), with SAME and one-sided explicit padding.
@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize('kernel_shape,strides,padding,xla_transposes', [
    ((3, 3, 8, 16), (1, 1), 'SAME', 0), ((3, 2, 8, 4), (1, 1), ((2, 0), (1, 1)), 0),
    ((3, 3, 8, 16), (2, 2), 'SAME', 1), ((1, 1, 8, 16), (2, 2), 'SAME', 0),
    ((7, 7, 8, 4), (2, 2), 'SAME', 1),
])
def test_gradients_equal_xlas(dtype, kernel_shape, strides, padding, xla_transposes):
  x, kernel = _operands((2, 9, 10, 8), kernel_shape, dtype)
  cotangent = jnp.asarray(RNG.standard_normal(
      _xla(x, kernel, strides, padding).shape), jnp.float32)

  def loss(conv):
    return lambda a, b: jnp.sum(conv(a, b, strides, padding).astype(jnp.float32) * cotangent)
  grad = jax.grad(loss(_ours), argnums=(0, 1))
  jaxpr = str(jax.make_jaxpr(grad)(x, kernel))
  assert jaxpr.count('conv_general_dilated') == xla_transposes
  got = jax.jit(grad)(x, kernel)
  want = jax.grad(loss(_xla), argnums=(0, 1))(x.astype(jnp.float32),
                                              kernel.astype(jnp.float32))
  # float32: the same sums in another order; bfloat16: each gradient rounded once.
  tolerance = 1e-5 if dtype == jnp.float32 else 2 ** -7
  for g, w in zip(got, want):
    assert g.dtype == dtype
    np.testing.assert_allclose(np.asarray(g, np.float32), w, rtol=tolerance,
                               atol=tolerance * np.abs(w).max())


@pytest.mark.parametrize('arguments', [
    dict(rhs_dilation=(2, 2)), dict(lhs_dilation=(2, 2), padding=((1, 1), (1, 1))),
    dict(feature_group_count=2), dict(padding=((-1, 0), (0, 0))),
    dict(dimension_numbers=('NCHW', 'OIHW', 'NCHW')),
], ids=['kernel dilation', 'input dilation', 'feature groups', 'negative padding', 'NCHW'])
def test_what_it_does_not_handle_goes_to_xla(arguments):
  x, kernel = _operands((1, 8, 8, 4), (3, 3, 2 if 'feature_group_count' in arguments else 4,
                                       6))
  call = dict(window_strides=(1, 1), padding='SAME', dimension_numbers=NHWC) | arguments
  if call['dimension_numbers'] != NHWC:
    x, kernel = x.transpose(0, 3, 1, 2), kernel.transpose(3, 2, 0, 1)
  jaxpr = str(jax.make_jaxpr(lambda a, b: blas_conv.conv_general_dilated(a, b, **call))(
      x, kernel))
  assert 'conv_general_dilated' in jaxpr
  assert not any(target in jaxpr for target in (*blas.CONV_TARGETS, *blas.GEMM_TARGETS))
  np.testing.assert_array_equal(blas_conv.conv_general_dilated(x, kernel, **call),
                                lax.conv_general_dilated(x, kernel, **call))


def _hybrid(dtype):
  model = models.get_model('R+ViT-testing', num_classes=3, dtype=dtype)
  images = jnp.asarray(RNG.standard_normal((2, 32, 32, 3)), jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), images)['params']
  return model, params, images


@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_the_hybrids_stem_convolves_on_the_blas(dtype):
  model, params, images = _hybrid(dtype)

  def logits(p, matmul):
    with kernels.use(matmul):
      return model.apply({'params': p}, images)
  on_blas = str(jax.make_jaxpr(lambda p: logits(p, 'blas'))(params))
  assert 'conv_general_dilated' not in on_blas
  # The root and each unit's 3x3 convolution gather patches; the 1x1 ones are products.
  assert sum(on_blas.count(t) for t in blas.CONV_TARGETS) == 1 + 2
  assert (flops.count_flops(lambda p: logits(p, 'blas'), params)
          == flops.count_flops(lambda p: logits(p, 'xla'), params))
  got = np.asarray(jax.jit(lambda p: logits(p, 'blas'))(params), np.float32)
  want = np.asarray(jax.jit(lambda p: logits(p, 'xla'))(params), np.float32)
  tolerance = 1e-4 if dtype == jnp.float32 else 0.1
  np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())


def test_the_hybrids_training_gradients_are_xlas():
  model, params, images = _hybrid(jnp.float32)

  def grads(matmul):
    def loss(p):
      with kernels.use(matmul, dropout='jax'):
        return jnp.sum(model.apply({'params': p}, images, train=False) ** 2)
    return jax.jit(jax.grad(loss))(params)
  got, want = grads('blas'), grads('xla')
  for path, g in jax.tree_util.tree_leaves_with_path(got):
    w = _at(want, path)
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * np.abs(w).max() + 1e-7,
                               err_msg=jax.tree_util.keystr(path))


def _at(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def test_a_module_that_brings_its_own_convolution_keeps_it():
  calls = []

  def own(*args, **kwargs):
    calls.append(1)
    return lax.conv_general_dilated(*args, **kwargs)
  conv = nn.Conv(4, (3, 3), conv_general_dilated=own)
  x = jnp.ones((1, 6, 6, 2))
  variables = conv.init(jax.random.key(0), x)
  with kernels.use('blas'):
    jaxpr = str(jax.make_jaxpr(lambda: conv.apply(variables, x))())
  assert calls and 'conv_general_dilated' in jaxpr
  assert not any(target in jaxpr for target in blas.CONV_TARGETS)
