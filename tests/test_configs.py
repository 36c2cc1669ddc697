"""configs/: model configs mirror the registry; run configs load and name real options."""

import importlib.util
import pathlib

import pytest

from vit_jax import models
from vit_jax.data import images
from vit_jax.train import optim

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'


def load_config_module(filename):
  spec = importlib.util.spec_from_file_location(filename, CONFIGS / filename)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('name', models.model_names())
def test_model_config_builds_the_registry_model(name):
  config = load_config_module('models.py').get_config(name)
  assert config.name == name
  settings = {k: v for k, v in config.items() if k != 'name'}
  required = ({'vocab_size': 100} if name.startswith('Transformer')
              else {'num_classes': 10})
  assert models.get_model(config.name, **settings, **required) == models.get_model(
      name, **required)


@pytest.mark.parametrize('filename,arg', [('vit_digits.py', None),
                                          ('vit.py', 'ViT-S_16,/data/my_images'),
                                          ('deit.py', 'DeiT-Ti_16,cifar10')])
def test_run_configs_use_only_known_fields(filename, arg):
  module = load_config_module(filename)
  config = module.get_config() if arg is None else module.get_config(arg)
  assert set(config.data) == set(images.default_config())
  assert set(config.optimizer) == set(optim.default_config())
  model = models.get_model(config.model.name, num_classes=10,
                           **{k: v for k, v in config.model.items() if k != 'name'})
  assert model.num_classes == 10
  if arg:
    assert config.data.dataset == arg.split(',')[1]
