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
