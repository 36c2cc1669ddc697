"""configs/: the model configs mirror the registry and build the same modules."""

import importlib.util
import pathlib

import pytest

from vit_jax import models

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
