"""The shared cross-entropy: integer labels equal the one-hot formula, smoothing included."""

import jax
import numpy as np
import optax
import pytest

from vit_jax.train.losses import cross_entropy


@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_integer_labels_equal_smoothed_one_hot_targets(smoothing):
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((3, 5, 11)).astype(np.float32) * 4
  labels = rng.integers(0, 11, (3, 5))
  targets = jax.nn.one_hot(labels, 11) * (1 - smoothing) + smoothing / 11
  expected = optax.softmax_cross_entropy(logits, targets)
  np.testing.assert_allclose(cross_entropy(logits, labels, smoothing), expected, rtol=1e-5,
                             atol=1e-6)
  grad = jax.grad(lambda z: cross_entropy(z, labels, smoothing).sum())(logits)
  np.testing.assert_allclose(grad, jax.nn.softmax(logits) - targets, atol=1e-6)
  # Soft labels take the same smoothing.
  soft = jax.nn.one_hot(labels, 11)
  np.testing.assert_allclose(cross_entropy(logits, soft, smoothing), expected, rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_gradient_of_integer_labels_is_one_pass_without_a_scatter(smoothing):
  """bfloat16 logits (a Transformer's tied projection) get a bfloat16 gradient, computed
  elementwise: no scatter into a (..., C) float32 array of zeros, as JAX's gradient of the
  label's logit would be."""
  rng = np.random.default_rng(1)
  logits = jax.numpy.asarray(rng.standard_normal((4, 6, 37)) * 3, jax.numpy.bfloat16)
  labels = rng.integers(0, 37, (4, 6))
  weights = rng.random((4, 6)).astype(np.float32)
  loss = lambda z: (cross_entropy(z, labels, smoothing) * weights).sum()  # noqa: E731
  grad = jax.jit(jax.grad(loss))(logits)
  assert grad.dtype == jax.numpy.bfloat16
  targets = jax.nn.one_hot(labels, 37) * (1 - smoothing) + smoothing / 37
  expected = (jax.nn.softmax(logits.astype(np.float32)) - targets) * weights[..., None]
  np.testing.assert_allclose(grad.astype(np.float32), expected, atol=1e-2, rtol=1e-2)
  assert 'scatter' not in str(jax.make_jaxpr(jax.grad(loss))(logits))
