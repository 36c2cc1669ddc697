"""Group normalisation in one kernel each way (vit_jax.kernels.group_norm): Flax's
`nn.GroupNorm` values and gradients inside `kernels.use`, and Flax for the options the kernel
does not take."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import norm_helpers
from vit_jax import kernels, models
from vit_jax.kernels import blas, group_norm

try:
  BLAS = blas.load()
except blas.KernelUnavailable as error:  # No compiler or no BLAS on this machine.
  pytest.skip(f'BLAS kernels unavailable: {error}', allow_module_level=True)

TARGETS = blas.GROUP_NORM_TARGETS
DTYPES = [jnp.float32] + ([jnp.bfloat16] if BLAS.bf16_symbol else [])
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _the_same_inputs_whatever_ran_before():
  RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


def _variables(norm, x):
  return norm_helpers.perturbed_variables(norm, x, RNG)


_apply = norm_helpers.apply_in


# Positions around the kernel's chunks of 256 (one, two with a remainder), ResNet's 32
# groups, groups of one channel and of all of them, an input far from zero, and a 2-D input.
@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize('shape,groups,offset', [
    ((2, 5, 7, 64), 32, 0.0), ((3, 20, 15, 16), 4, 0.0), ((2, 3, 8), 8, 0.0),
    ((2, 3, 8), 1, 0.0), ((2, 9, 9, 32), 32, 50.0), ((4, 12), 3, 0.0),
])
def test_inference_gives_flaxs_values(dtype, shape, groups, offset):
  x = jnp.asarray(RNG.standard_normal(shape) * 2 + offset, dtype)
  norm = nn.GroupNorm(num_groups=groups, dtype=dtype)
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


def test_group_size_counts_as_its_groups():
  x = jnp.asarray(RNG.standard_normal((2, 6, 6, 12)), jnp.float32)
  norm = nn.GroupNorm(num_groups=None, group_size=4, dtype=jnp.float32)
  variables = _variables(norm, x)
  got, jaxpr = _apply(norm, variables, x, 'blas')
  assert jaxpr.count(blas.GROUP_NORM_TARGET) == 1
  np.testing.assert_allclose(got, norm.apply(variables, x), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize('options', [
    dict(use_fast_variance=False), dict(use_bias=False), dict(use_scale=False),
    dict(reduction_axes=(-1,)), dict(force_float32_reductions=False), dict(dtype=None),
], ids=lambda o: next(iter(o)))
def test_other_options_stay_with_flax(options):
  x = jnp.asarray(RNG.standard_normal((2, 4, 4, 8)), jnp.float32)
  norm = nn.GroupNorm(num_groups=4, **({'dtype': jnp.float32} | options))
  variables = _variables(norm, x)
  got, jaxpr = _apply(norm, variables, x, 'blas')
  assert not any(t in jaxpr for t in TARGETS)
  np.testing.assert_array_equal(got, jax.jit(norm.apply)(variables, x))


def test_a_mask_stays_with_flax():
  x = jnp.asarray(RNG.standard_normal((2, 4, 8)), jnp.float32)
  mask = jnp.asarray(RNG.random((2, 4, 8)) > 0.3)
  norm = nn.GroupNorm(num_groups=4, dtype=jnp.float32)
  variables = _variables(norm, x)
  with kernels.use('blas'):
    jaxpr = str(jax.make_jaxpr(lambda: norm.apply(variables, x, mask=mask))())
  assert not any(t in jaxpr for t in TARGETS)


@pytest.mark.parametrize('dtype', DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize('shape,groups,offset', [
    ((2, 5, 5, 16), 4, 0.0), ((3, 20, 15, 8), 8, 0.0), ((2, 9, 9, 32), 32, 20.0),
])
def test_gradients_are_flaxs(dtype, shape, groups, offset):
  x = jnp.asarray(RNG.standard_normal(shape) * 2 + offset, dtype)
  cotangent = jnp.asarray(RNG.standard_normal(x.shape), jnp.float32)
  norm = nn.GroupNorm(num_groups=groups, dtype=dtype)
  variables = _variables(norm, x)

  def grads(matmul):
    def loss(v, a):
      with kernels.use(matmul):
        return jnp.sum(norm.apply(v, a).astype(jnp.float32) * cotangent)
    grad = jax.grad(loss, argnums=(0, 1))
    return jax.jit(grad)(variables, x), str(jax.make_jaxpr(grad)(variables, x))
  (got, got_jaxpr), (want, _) = grads('blas'), grads('xla')
  assert got_jaxpr.count(blas.GROUP_NORM_BACKWARD_TARGET if dtype == jnp.float32
                         else blas.GROUP_NORM_BACKWARD_BF16_TARGET) == 1
  # float32: the same gradient summed in another order; bfloat16: the images' gradient
  # rounded once from float32 values that differ in their last bits.
  tolerance = 2e-4 if dtype == jnp.float32 else 2 ** -7
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance * np.abs(w).max())


def test_the_function_takes_bfloat16_params():
  x = jnp.asarray(RNG.standard_normal((2, 3, 8)), jnp.bfloat16)
  scale, bias = jnp.ones(8, jnp.bfloat16) * 2, jnp.full(8, 0.5, jnp.bfloat16)
  got = jax.jit(lambda *a: group_norm.group_norm(*a, 2, 1e-6))(x, scale, bias)
  norm = nn.GroupNorm(num_groups=2, dtype=jnp.bfloat16)
  want = norm.apply({'params': {'scale': scale.astype(jnp.float32),
                                'bias': bias.astype(jnp.float32)}}, x)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=2 ** -7, atol=2 ** -7)


def test_the_hybrid_normalises_in_the_kernel():
  model = models.get_model('R+ViT-testing', num_classes=3)
  images = jnp.asarray(RNG.standard_normal((2, 32, 32, 3)), jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), images)['params']
  norms = sum(1 for path, _ in jax.tree_util.tree_leaves_with_path(params)
              if jax.tree_util.keystr(path).endswith("['scale']")
              and "['gn" in jax.tree_util.keystr(path))

  def logits(p):
    with kernels.use('blas'):
      return model.apply({'params': p}, images)
  jaxpr = str(jax.make_jaxpr(logits)(params))
  assert norms > 0 and jaxpr.count(blas.GROUP_NORM_TARGET) == norms
