"""Layer normalisation in one kernel each way (vit_jax.kernels.layer_norm): Flax's
`nn.LayerNorm` values and gradients inside `kernels.use`, and Flax for the options the kernel
does not take."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import norm_helpers
from vit_jax import kernels, models
from vit_jax.kernels import blas, layer_norm

try:
  BLAS = blas.load()
except blas.KernelUnavailable as error:  # No compiler or no BLAS on this machine.
  pytest.skip(f'BLAS kernels unavailable: {error}', allow_module_level=True)

TARGETS = (blas.LAYER_NORM_TARGET, blas.LAYER_NORM_BF16_TARGET, blas.LAYER_NORM_BACKWARD_TARGET,
           blas.LAYER_NORM_BACKWARD_BF16_TARGET)
DTYPES = [jnp.float32] + ([jnp.bfloat16] if BLAS.bf16_symbol else [])
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _the_same_inputs_whatever_ran_before():
  RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


def _variables(norm, x):
  return norm_helpers.perturbed_variables(norm, x, RNG)


_apply = norm_helpers.apply_in


# Rows around the kernel's blocks of 16 (fewer, several with a remainder), widths that are
# not a multiple of its 16 partial sums, an input far from zero, ViT-S/16's tokens.
@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize('shape,offset', [
    ((3, 8), 0.0), ((2, 21, 40), 0.0), ((4, 7, 5, 33), 0.0), ((2, 9, 64), 50.0),
    ((2, 197, 384), 0.0),
])
def test_inference_gives_flaxs_values(dtype, shape, offset):
  x = jnp.asarray(RNG.standard_normal(shape) * 2 + offset, dtype)
  norm = nn.LayerNorm(epsilon=1e-6, dtype=dtype)
  variables = _variables(norm, x)
  got, jaxpr = _apply(norm, variables, x, 'blas')
  want, plain = _apply(norm, variables, x, 'xla')
  assert sum(jaxpr.count(t) for t in TARGETS) == 1
  assert not any(t in plain for t in TARGETS)
  assert got.dtype == want.dtype == dtype
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  if dtype == jnp.float32:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * (1 + offset))
  else:  # Rounded once from float32 results that differ in their last bits: one rounding.
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.parametrize('options', [
    dict(use_fast_variance=False), dict(use_bias=False), dict(use_scale=False),
    dict(reduction_axes=(-2, -1)), dict(force_float32_reductions=False), dict(dtype=None),
], ids=lambda o: next(iter(o)))
def test_other_options_stay_with_flax(options):
  x = jnp.asarray(RNG.standard_normal((2, 4, 8)), jnp.float32)
  norm = nn.LayerNorm(**({'dtype': jnp.float32} | options))
  variables = _variables(norm, x)
  got, jaxpr = _apply(norm, variables, x, 'blas')
  assert not any(t in jaxpr for t in TARGETS)
  np.testing.assert_array_equal(got, jax.jit(norm.apply)(variables, x))


def test_a_mask_stays_with_flax():
  x = jnp.asarray(RNG.standard_normal((2, 4, 8)), jnp.float32)
  mask = jnp.asarray(RNG.random((2, 4, 8)) > 0.3)
  norm = nn.LayerNorm(dtype=jnp.float32)
  variables = _variables(norm, x)
  with kernels.use('blas'):
    jaxpr = str(jax.make_jaxpr(lambda: norm.apply(variables, x, mask=mask))())
  assert not any(t in jaxpr for t in TARGETS)


@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize('shape,offset', [((2, 21, 40), 0.0), ((3, 9, 64), 20.0),
                                          ((2, 197, 384), 0.0)])
def test_gradients_are_flaxs(dtype, shape, offset):
  x = jnp.asarray(RNG.standard_normal(shape) * 2 + offset, dtype)
  cotangent = jnp.asarray(RNG.standard_normal(x.shape), jnp.float32)
  norm = nn.LayerNorm(epsilon=1e-6, dtype=dtype)
  variables = _variables(norm, x)

  def grads(matmul):
    def loss(v, a):
      with kernels.use(matmul):
        return jnp.sum(norm.apply(v, a).astype(jnp.float32) * cotangent)
    grad = jax.grad(loss, argnums=(0, 1))
    return jax.jit(grad)(variables, x), str(jax.make_jaxpr(grad)(variables, x))
  (got, got_jaxpr), (want, _) = grads('blas'), grads('xla')
  assert got_jaxpr.count(blas.LAYER_NORM_BACKWARD_TARGET if dtype == jnp.float32
                         else blas.LAYER_NORM_BACKWARD_BF16_TARGET) == 1
  # float32: the same gradient summed in another order; bfloat16: the input's gradient
  # rounded once from float32 values that differ in their last bits.
  tolerance = 2e-4 if dtype == jnp.float32 else 2 ** -7
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance * np.abs(w).max())


def test_the_function_takes_bfloat16_params():
  x = jnp.asarray(RNG.standard_normal((2, 3, 8)), jnp.bfloat16)
  scale, bias = jnp.ones(8, jnp.bfloat16) * 2, jnp.full(8, 0.5, jnp.bfloat16)
  got = jax.jit(lambda *a: layer_norm.layer_norm(*a, 1e-6))(x, scale, bias)
  norm = nn.LayerNorm(epsilon=1e-6, dtype=jnp.bfloat16)
  want = norm.apply({'params': {'scale': scale.astype(jnp.float32),
                                'bias': bias.astype(jnp.float32)}}, x)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.parametrize('model_name', ['ViT-testing', 'Transformer-testing'])
def test_the_models_normalise_in_the_kernel(model_name):
  # Every LayerNorm of a ViT (two per block, the encoder's last) and of the seq2seq
  # Transformer (the encoder's and the decoder's) both ways in a train step.
  if model_name == 'ViT-testing':
    model = models.get_model(model_name, num_classes=3)
    inputs = (jnp.asarray(RNG.standard_normal((2, 16, 16, 3)), jnp.float32),)
  else:
    model = models.get_model(model_name, vocab_size=11, dropout_rate=0.0)
    inputs = tuple(jnp.asarray(RNG.integers(1, 11, (2, n)), jnp.int32) for n in (7, 5))
  params = jax.jit(model.init)(jax.random.key(0), *inputs)['params']
  norms = sum(1 for path, _ in jax.tree_util.tree_leaves_with_path(params)
              if jax.tree_util.keystr(path).endswith("['scale']"))

  def loss(p):
    with kernels.use('blas'):
      return jnp.sum(model.apply({'params': p}, *inputs) ** 2)
  jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params))
  assert norms > 2
  assert jaxpr.count(blas.LAYER_NORM_TARGET) == norms
  assert jaxpr.count(blas.LAYER_NORM_BACKWARD_TARGET) == norms
