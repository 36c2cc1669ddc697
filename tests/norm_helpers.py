"""What the normalisation kernels' tests share (test_group_norm.py, test_layer_norm.py)."""

import jax
import jax.numpy as jnp

from vit_jax import kernels


def perturbed_variables(norm, x, rng):
  """`norm`'s variables for `x`, its scales and biases moved away from their initial 1 and 0
  (draws from `rng`), so that both are checked."""
  variables = norm.init(jax.random.key(0), x)
  return jax.tree.map(lambda a: a + jnp.asarray(rng.standard_normal(a.shape) * 0.3, a.dtype),
                      variables)


def apply_in(norm, variables, x, matmul):
  """(`norm` applied to x inside `kernels.use(matmul)`, jitted; the jaxpr as text)."""
  def run(v, a):
    with kernels.use(matmul):
      return norm.apply(v, a)
  return jax.jit(run)(variables, x), str(jax.make_jaxpr(run)(variables, x))
