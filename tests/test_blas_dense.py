"""bfloat16 Dense layers with the bias and activation in the product's epilogue
(vit_jax.kernels.blas_dense): within one bfloat16 rounding of the exact layer, in the models
wherever they run bfloat16 inference on MKL, and training exactly as before."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import kernels, models
from vit_jax.kernels import blas, blas_dense, seam
from vit_jax.models import layers

try:
  BLAS = blas.load()
except blas.KernelUnavailable as error:  # No compiler or no BLAS on this machine.
  pytest.skip(f'BLAS kernels unavailable: {error}', allow_module_level=True)
if not BLAS.bf16_pack_symbols:
  pytest.skip(f"{BLAS.name} has no packed bfloat16 product", allow_module_level=True)

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _the_same_inputs_whatever_ran_before():
  RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


def _random_bfloat16(*shape, scale=1.0):
  return jnp.asarray(RNG.standard_normal(shape) * scale, jnp.bfloat16)


def _exact(x, kernel, bias, activation):
  """The layer in float64 from the bfloat16 inputs (Flax's `nn.gelu`: the tanh form)."""
  x, kernel, bias = (np.asarray(a, np.float64) for a in (x, kernel, bias))
  count = kernel.ndim - bias.ndim
  y = np.tensordot(x, kernel, axes=count) + bias
  if activation == 'gelu':
    return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
  return np.maximum(y, 0) if activation == 'relu' else y


# Rows around the kernel's panels of 128 (one short panel, an exact one, one more row); a
# DenseGeneral projection to heads (kernel (K, N, H)) and one from them (kernel (N, H, D)).
@pytest.mark.parametrize('activation', [None, 'gelu', 'relu'])
@pytest.mark.parametrize('x_shape,kernel_shape,bias_shape', [
    ((1, 24), (24, 40), (40,)),
    ((2, 64, 24), (24, 40), (40,)),
    ((3, 43, 24), (24, 40), (40,)),
    ((300, 96), (96, 16), (16,)),
    ((2, 5, 24), (24, 3, 8), (3, 8)),
    ((2, 5, 3, 8), (3, 8, 24), (24,)),
])
def test_dense_is_within_one_bfloat16_rounding_of_the_exact_layer(
    activation, x_shape, kernel_shape, bias_shape):
  x = _random_bfloat16(*x_shape)
  contracted = np.prod(kernel_shape[:len(kernel_shape) - len(bias_shape)])
  kernel = _random_bfloat16(*kernel_shape, scale=1 / np.sqrt(contracted))
  bias = _random_bfloat16(*bias_shape)
  layer = jax.jit(lambda *a: blas_dense.dense_bfloat16(*a, activation))
  assert blas.DENSE_BF16_TARGET in str(jax.make_jaxpr(layer)(x, kernel, bias))
  got = layer(x, kernel, bias)
  exact = _exact(x, kernel, bias, activation)
  assert got.dtype == jnp.bfloat16 and got.shape == exact.shape
  # One rounding to bfloat16 (8 significant bits) of a float32 sum.
  np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2 ** -8,
                             atol=1e-5 * np.abs(exact).max())


def test_a_nan_reaches_its_own_row_only():
  x, kernel, bias = _random_bfloat16(200, 16), _random_bfloat16(16, 8), _random_bfloat16(8)
  for activation in blas_dense.ACTIVATIONS:
    out = np.asarray(jax.jit(lambda *a, act=activation: blas_dense.dense_bfloat16(*a, act))(
        x.at[150, 3].set(jnp.nan), kernel, bias), np.float32)
    assert np.isnan(out[150]).all() and np.isnan(out).sum() == 8, activation


def test_an_unknown_activation_is_refused():
  with pytest.raises(ValueError, match="unknown activation 'swish'"):
    blas_dense.dense_bfloat16(_random_bfloat16(2, 4), _random_bfloat16(4, 3),
                              _random_bfloat16(3), 'swish')


def _without_dense_kernels(monkeypatch):
  """The seam as it was before `blas_dense`: Dense layers multiply on the BLAS alone."""
  monkeypatch.setattr(seam, '_dense_params', lambda layer, args: None)
  for interceptor in ('_mlp_in_dense_kernels', '_patch_embedding_in_dense_kernel'):
    monkeypatch.setattr(seam, interceptor,
                        lambda next_fun, args, kwargs, context: next_fun(*args, **kwargs))


def _vit(**overrides):
  model = models.get_model('ViT-testing', num_classes=5, dtype=jnp.bfloat16, **overrides)
  images = jnp.asarray(RNG.standard_normal((2, 16, 16, 3)), jnp.float32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images)['params']
  # The head starts at zeros, which would leave every other gradient zero.
  params['head']['kernel'] = jnp.asarray(RNG.standard_normal(params['head']['kernel'].shape),
                                         jnp.float32)
  return model, params, images


@pytest.mark.parametrize('scan_layers', [False, True])
def test_bfloat16_vit_inference_runs_every_dense_layer_in_one_kernel(scan_layers):
  model, params, images = _vit(scan_layers=scan_layers)

  def logits(p):
    with kernels.use('blas'):
      return model.apply({'params': p}, images)
  jaxpr = str(jax.make_jaxpr(logits)(params))
  # q, k, v, out and the MLP's two per block (the scanned body traced once), the head, the
  # patch embedding.
  blocks = 1 if scan_layers else model.num_layers
  assert jaxpr.count(blas.DENSE_BF16_TARGET) == 6 * blocks + 2
  assert blas.GEMM_BF16_TARGET not in jaxpr
  got = np.asarray(jax.jit(logits)(params), np.float32)
  flax_bfloat16 = np.asarray(jax.jit(lambda p: model.apply({'params': p}, images))(params),
                             np.float32)
  float32 = model.clone(dtype=jnp.float32)
  exact = np.asarray(jax.jit(lambda p: float32.apply({'params': p}, images))(params),
                     np.float32)
  # Each rounds to bfloat16 (8 bits) in its own places through the layers (the kernels once
  # per layer, Flax after each operation): both within a few steps of the largest logit's
  # of the float32 model.
  for logits_bfloat16 in (got, flax_bfloat16):
    np.testing.assert_allclose(logits_bfloat16, exact, atol=2 ** -5 * float(np.abs(exact).max()))


def test_bfloat16_vit_training_is_what_it_was_without_the_kernel(monkeypatch):
  # Differentiated, each layer is Flax's Dense on the BLAS: the loss and the gradients are
  # bit for bit those of the seam without `blas_dense` (MLP dropout 0, so the MLP block is
  # taken too), but for the Dense layers' biases, summed in float32 (the next test).
  model, params, images = _vit()

  def loss(p):
    with kernels.use('blas'):
      logits = model.apply({'params': p}, images, train=True, rngs={'dropout': jax.random.key(1)})
    return jnp.sum(logits.astype(jnp.float32) ** 2)
  step = lambda p: jax.value_and_grad(loss)(p)  # noqa: E731
  # The seam takes the layers; their gradient runs Flax's.
  assert blas.DENSE_BF16_TARGET in str(jax.make_jaxpr(loss)(params))
  assert blas.DENSE_BF16_TARGET not in str(jax.make_jaxpr(step)(params))
  got = jax.jit(step)(params)
  _without_dense_kernels(monkeypatch)
  want = jax.jit(lambda p: step(p))(params)
  # Differentiated, the patch embedding convolves on `blas_conv` either way.
  compared = 0
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    names = jax.tree_util.keystr(path)
    if "'bias'" in names and 'LayerNorm' not in names and 'embedding' not in names:
      continue  # A Dense layer's bias: XLA's sum in bfloat16 against ours in float32.
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    compared += 1
  assert compared > len(jax.tree.leaves(got)) // 2
  assert float(np.abs(np.asarray(got[1]['embedding']['kernel'], np.float32)).max()) > 0


@pytest.mark.parametrize('shape,kernel_shape,bias_shape', [
    ((8, 300, 32), (32, 64), (64,)), ((4, 50, 32), (32, 4, 8), (4, 8))])
def test_a_bfloat16_layers_bias_gradient_is_its_exact_sum_rounded_once(shape, kernel_shape,
                                                                      bias_shape):
  # XLA:CPU's gradient of a bfloat16 bias (autodiff's bfloat16 sum over the rows) is not the
  # exact sum rounded on this many rows; the kernels' sums in float32 and rounds once.
  layer = (nn.DenseGeneral(bias_shape, dtype=jnp.bfloat16) if len(bias_shape) > 1
           else nn.Dense(bias_shape[0], dtype=jnp.bfloat16))
  x = jnp.asarray(RNG.standard_normal(shape), jnp.float32)
  cotangent = _random_bfloat16(*shape[:-1], *bias_shape, scale=3.0)
  params = layer.init(jax.random.PRNGKey(0), x)

  def loss(p):
    with kernels.use('blas'):
      y = layer.apply(p, x)
    return jnp.sum(y.astype(jnp.float32) * cotangent.astype(jnp.float32))
  got = np.asarray(jax.jit(jax.grad(loss))(params)['params']['bias'], np.float64)
  exact = np.asarray(cotangent, np.float64).reshape(-1, *bias_shape).sum(0)
  np.testing.assert_array_equal(got, exact.astype(jnp.bfloat16).astype(np.float64))


def test_an_mlp_block_with_dropout_in_training_keeps_its_layers():
  block = layers.MlpBlock(mlp_dim=32, dropout_rate=0.1, dtype=jnp.bfloat16)
  x = _random_bfloat16(2, 5, 16)
  variables = block.init(jax.random.key(0), x)

  def run(deterministic):
    with kernels.use('blas'):
      return block.apply(variables, x, deterministic=deterministic,
                         rngs={'dropout': jax.random.key(1)})
  training = str(jax.make_jaxpr(lambda: run(False))())
  # Its Dense layers still take the kernel (bias, no activation); the GELU runs between.
  assert training.count(blas.DENSE_BF16_TARGET) == 2 and 'tanh' in training
  inference = str(jax.make_jaxpr(lambda: run(True))())
  assert inference.count(blas.DENSE_BF16_TARGET) == 2 and 'tanh' not in inference


def test_without_mkls_packed_product_the_layers_multiply_as_before(monkeypatch):
  monkeypatch.setattr(blas, 'load', lambda: BLAS._replace(bf16_pack_symbols=None))
  model, params, images = _vit()

  def logits(p):
    with kernels.use('blas'):
      return model.apply({'params': p}, images)
  jaxpr = str(jax.make_jaxpr(logits)(params))
  # The patch embedding convolves on the BLAS (`blas_conv`), its bias added by Flax.
  assert blas.DENSE_BF16_TARGET not in jaxpr and 'conv_general_dilated' not in jaxpr
  assert jaxpr.count(blas.CONV_BF16_TARGET) == 1
  assert jaxpr.count(blas.GEMM_BF16_TARGET) == 6 * model.num_layers + 1


def test_float32_layers_are_left_to_the_products():
  block = layers.MlpBlock(mlp_dim=32)
  x = jnp.asarray(RNG.standard_normal((2, 5, 16)), jnp.float32)
  variables = block.init(jax.random.key(0), x)
  with kernels.use('blas'):
    jaxpr = str(jax.make_jaxpr(lambda: block.apply(variables, x))())
  assert blas.DENSE_BF16_TARGET not in jaxpr and jaxpr.count(blas.GEMM_TARGET) == 2


@pytest.mark.parametrize('image_shape', [(2, 16, 16, 3), (1, 18, 13, 3)])
def test_the_patch_embedding_is_within_one_bfloat16_rounding_of_the_convolution(image_shape):
  # 18 x 13 pixels: the convolution ('VALID') leaves out the last rows and columns.
  images = _random_bfloat16(*image_shape)
  kernel, bias = _random_bfloat16(4, 4, 3, 8, scale=0.2), _random_bfloat16(8)
  embed = jax.jit(blas_dense.patch_embedding_bfloat16)
  assert blas.DENSE_BF16_TARGET in str(jax.make_jaxpr(embed)(images, kernel, bias))
  got = embed(images, kernel, bias)
  as_float64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
  exact = np.asarray(jax.lax.conv_general_dilated(
      as_float64(images).astype(np.float32), as_float64(kernel).astype(np.float32), (4, 4),
      'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=jax.lax.Precision.HIGHEST), np.float64) + as_float64(bias)
  assert got.dtype == jnp.bfloat16 and got.shape == exact.shape
  np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2 ** -8,
                             atol=1e-5 * np.abs(exact).max())


def test_vit_patch_embedding_takes_the_kernel_in_inference_and_trains_as_before(monkeypatch):
  model, params, images = _vit()

  def logits(p):
    with kernels.use('blas'):
      return model.apply({'params': p}, images)
  # 6 Dense layers per block, the head and the patch embedding; no convolution left.
  jaxpr = str(jax.make_jaxpr(logits)(params))
  assert jaxpr.count(blas.DENSE_BF16_TARGET) == 6 * model.num_layers + 2
  assert 'conv_general_dilated' not in jaxpr

  def loss(p):
    return jnp.sum(logits(p).astype(jnp.float32) ** 2)
  got = jax.jit(jax.value_and_grad(loss))(params)
  # Differentiated, the convolution on the BLAS (`blas_conv`), as without this kernel: none
  # left to XLA, which computes a bfloat16 convolution and its kernel gradient in float32.
  grad_jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params))
  assert 'conv_general_dilated' not in grad_jaxpr
  assert blas.CONV_WEIGHT_GRAD_BF16_TARGET in grad_jaxpr
  monkeypatch.setattr(seam, '_patch_embedding_in_dense_kernel',
                      lambda next_fun, args, kwargs, context: next_fun(*args, **kwargs))
  want = jax.jit(lambda p: jax.value_and_grad(loss)(p))(params)
  # The same loss and gradients as `blas_conv` gives (embedding kernel included).
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
  assert float(np.abs(np.asarray(got[1]['embedding']['kernel'], np.float32)).max()) > 0


def test_gradients_reach_the_images_through_the_patch_embedding(monkeypatch):
  # As for a saliency map: the images' gradient, which a train step leaves out (and then
  # traces none: test_blas.py counts the FLOPs).
  model, params, images = _vit()

  def image_gradient(x):
    def loss(x):
      with kernels.use('blas'):
        return jnp.sum(model.apply({'params': params}, x).astype(jnp.float32) ** 2)
    return jax.grad(loss)(x)
  got = jax.jit(image_gradient)(images)
  _without_dense_kernels(monkeypatch)
  want = jax.jit(lambda x: image_gradient(x))(images)
  assert float(np.abs(want).max()) > 0
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
