"""Optimizers from the config: an option that does not apply to the chosen one is an error."""

import pytest

from vit_jax import errors
from vit_jax.train import optim


@pytest.mark.parametrize('name', ['sgd', 'adam'])
def test_weight_decay_without_adamw_is_an_error(name):
  config = optim.default_config()
  config.name, config.weight_decay = name, 0.05
  with pytest.raises(errors.ConfigError,
                     match=rf"weight_decay=0.05 applies to adamw only, but the optimizer is "
                           rf"'{name}'"):
    optim.make_optimizer(config, total_steps=10)
  config.weight_decay = 0.0
  optim.make_optimizer(config, total_steps=10)


def test_adamw_decays_kernels_only():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  params = {'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}}
  config = optim.default_config()
  config.weight_decay, config.learning_rate, config.grad_clip_norm = 0.5, 1.0, 0.0
  tx, _ = optim.make_optimizer(config, total_steps=10)
  zeros = {'dense': {'kernel': jnp.zeros((2, 2)), 'bias': jnp.zeros(2)}}
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert float(updates['dense']['bias'][0]) == 0.0
  assert float(updates['dense']['kernel'][0, 0]) != 0.0
