"""Dropout masks from the counter hash: Bernoulli(p) masks, and where `kernels.use` puts them."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import errors, kernels
from vit_jax.kernels import dropout


@pytest.mark.parametrize('p', [0.1, 0.5, 0.9])
def test_masks_keep_each_element_with_probability_p(p):
  mask = np.asarray(jax.jit(dropout.bernoulli, static_argnums=(1, 2))(
      jax.random.key(0), p, (256, 1024)))
  assert mask.dtype == bool
  assert abs(mask.mean() - p) < 0.005, mask.mean()
  # Over 400 keys each position is kept about p of the time: no position is favoured.
  keys = jax.random.split(jax.random.key(1), 400)
  masks = np.asarray(jax.vmap(lambda k: dropout.bernoulli(k, p, (64,)))(keys))
  per_position = masks.mean(axis=0)
  spread = 4 * np.sqrt(p * (1 - p) / 400)
  assert np.all(np.abs(per_position - p) < spread), per_position


def test_neighbours_and_keys_are_uncorrelated():
  def masks(key):
    return np.asarray(dropout.bernoulli(key, 0.5, (512, 512)), np.float32)
  a = masks(jax.random.key(0))
  for other in (np.roll(a, 1, axis=1), np.roll(a, 1, axis=0), masks(jax.random.key(1)),
                masks(jax.random.fold_in(jax.random.key(0), 1))):
    assert abs(np.corrcoef(a.ravel(), other.ravel())[0, 1]) < 0.01
  # Deterministic, and raw key data (jax.random.PRNGKey) gives what its typed key gives.
  np.testing.assert_array_equal(a, masks(jax.random.key(0)))
  np.testing.assert_array_equal(a, masks(jax.random.PRNGKey(0)))


class _Dropouts(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    return (nn.Dropout(0.3)(x, deterministic=not train),
            nn.Dropout(0.5, broadcast_dims=(0,))(x, not train))


def _apply(x, train=True):
  return jax.jit(lambda x, rng: _Dropouts().apply({}, x, train, rngs={'dropout': rng}))(
      x, jax.random.key(0))


def test_use_puts_flax_dropout_on_the_hash_masks():
  x = jnp.ones((64, 512))
  plain = _apply(x)
  with kernels.use('xla', 'jax'):
    np.testing.assert_array_equal(_apply(x)[0], plain[0])  # 'jax' is plain Flax.
  with kernels.use('xla', 'hash'):
    hashed, broadcast = _apply(x)
    evaluated = jax.jit(lambda x: _Dropouts().apply({}, x, False))(x)
  assert not np.array_equal(hashed, plain[0])
  assert abs(float((hashed != 0).mean()) - 0.7) < 0.01
  np.testing.assert_allclose(np.unique(hashed), [0.0, 1 / 0.7], rtol=1e-6)  # Scaled by 1/keep.
  np.testing.assert_array_equal(broadcast, np.broadcast_to(broadcast[:1], broadcast.shape))
  np.testing.assert_array_equal(evaluated[0], x)  # Deterministic: the inputs as they are.
  # Gradients flow through the kept elements only, scaled as the outputs are.
  with kernels.use('xla', 'hash'):
    grad = jax.grad(lambda x: jnp.sum(_Dropouts().apply(
        {}, x, True, rngs={'dropout': jax.random.key(0)})[0]))(x)
  np.testing.assert_allclose(grad, hashed, rtol=1e-6)


def test_unknown_dropout_masks_are_a_config_error():
  with pytest.raises(errors.ConfigError, match=r"Unknown dropout masks 'fast'; choose one of"):
    with kernels.use('xla', 'fast'):
      pass


@pytest.mark.parametrize('p', [-0.5, 1.5])
def test_a_probability_outside_0_1_is_a_value_error_not_an_overflow(p):
  with pytest.raises(ValueError, match=rf'p={p} is not a probability'):
    dropout.bernoulli(jax.random.key(0), p, (8,))


def test_a_module_with_a_dropout_rate_above_1_names_the_rate():
  with kernels.use('xla', 'hash'), pytest.raises(ValueError, match=r'rate=1\.5\): a dropout'):
    nn.Dropout(1.5).apply({}, jnp.ones((4, 8)), False, rngs={'dropout': jax.random.key(0)})
