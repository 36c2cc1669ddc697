"""bfloat16 Dense layers' bias gradients summed in float32 (vit_jax.kernels.bias), on CPUs,
whoever multiplies."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import kernels
from vit_jax.models.backend import target_backend

RNG = np.random.default_rng(0)

LAYERS = {
    'Dense': (lambda: nn.Dense(64, dtype=jnp.bfloat16), (8, 300, 32), (64,)),
    'DenseGeneral to heads': (lambda: nn.DenseGeneral((4, 8), dtype=jnp.bfloat16),
                              (4, 50, 32), (4, 8)),
    'DenseGeneral from heads': (lambda: nn.DenseGeneral(16, axis=(-2, -1), dtype=jnp.bfloat16),
                                (4, 50, 4, 8), (16,)),
}


def _loss_and_gradients(layer, x, cotangent, matmul):
  def loss(p):
    with kernels.use(matmul):
      y = layer.apply(p, x)
    return jnp.sum(y.astype(jnp.float32) * cotangent.astype(jnp.float32))
  with kernels.use(matmul):
    params = layer.init(jax.random.PRNGKey(0), x)
  return params, loss


@pytest.mark.parametrize('name', LAYERS)
def test_a_bfloat16_bias_gradient_on_xlas_products_is_the_exact_sum_rounded_once(name):
  make, shape, bias_shape = LAYERS[name]
  layer = make()
  x = jnp.asarray(RNG.standard_normal(shape), jnp.float32)
  cotangent = jnp.asarray(RNG.standard_normal((*shape[:2], *bias_shape)) * 3, jnp.bfloat16)
  params, loss = _loss_and_gradients(layer, x, cotangent, 'xla')
  assert set(params['params']) == {'kernel', 'bias'}
  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  exact = np.asarray(cotangent, np.float64).reshape(-1, *bias_shape).sum(0)
  np.testing.assert_array_equal(np.asarray(grads['params']['bias'], np.float64),
                                exact.astype(jnp.bfloat16).astype(np.float64))
  # The layer's value and its kernel's gradient are plain Flax's, bit for bit.
  plain = lambda p: jnp.sum(  # noqa: E731
      layer.apply(p, x).astype(jnp.float32) * cotangent.astype(jnp.float32))
  want_value, want = jax.jit(jax.value_and_grad(plain))(params)
  assert float(value) == float(want_value)
  np.testing.assert_array_equal(grads['params']['kernel'], want['params']['kernel'])


def test_float32_layers_and_other_backends_keep_flaxs_bias():
  x = jnp.asarray(RNG.standard_normal((4, 6, 8)), jnp.float32)

  def bias_summed_in(layer) -> set:
    """The dtypes of the sums to the bias's shape in `layer`'s gradient."""
    params = layer.init(jax.random.PRNGKey(0), x)

    def loss(p):
      with kernels.use('xla'):
        return jnp.sum(layer.apply(p, x).astype(jnp.float32))
    jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
    return {str(eqn.outvars[0].aval.dtype) for eqn in jaxpr.eqns
            if eqn.primitive.name == 'reduce_sum' and eqn.outvars[0].aval.shape == (5,)}
  assert bias_summed_in(nn.Dense(5, dtype=jnp.bfloat16)) == {'float32'}
  assert bias_summed_in(nn.Dense(5)) == {'float32'}  # Flax's own, in float32.
  assert bias_summed_in(nn.Dense(5, dtype=jnp.bfloat16, use_bias=False)) == set()
  with target_backend('gpu'):  # Traced for a GPU: Flax's layer as it is.
    assert bias_summed_in(nn.Dense(5, dtype=jnp.bfloat16)) == {'bfloat16'}
