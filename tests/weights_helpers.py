"""Shared by the tests of `vit_jax.weights`: tiny models, their params, exact comparisons."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import weights
from vit_jax.models import get_model

MODELS = ('ViT-testing', 'R+ViT-testing', 'DeiT-testing')
NUM_CLASSES = 10
SIZE = 16  # Image side: a 4x4 patch grid for ViT/DeiT-testing, 2x2 for R+ViT-testing.
POSEMB = 'Transformer/posembed_input/pos_embedding'


@functools.cache
def _model(name, num_classes=NUM_CLASSES, **overrides):
  return get_model(name, num_classes=num_classes, **overrides)


@functools.cache
def _shapes(name, num_classes=NUM_CLASSES, size=SIZE, **overrides):
  """Parameter shapes (jax.ShapeDtypeStruct leaves) of a model at `size` pixels."""
  model = _model(name, num_classes, **overrides)
  images = jnp.zeros((1, size, size, 3))
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))['params']


@functools.cache
def _random_params(name, num_classes=NUM_CLASSES, seed=0, size=SIZE, **overrides):
  """Non-zero params (the real head is zero-initialised, which would hide mistakes)."""
  rng = np.random.default_rng([seed, sum(map(ord, name))])
  return jax.tree.map(lambda s: rng.normal(0.0, 0.2, s.shape).astype(np.float32),
                      _shapes(name, num_classes, size, **overrides))


@functools.cache
def _apply_fn(name, num_classes=NUM_CLASSES, **overrides):
  model = _model(name, num_classes, **overrides)
  return jax.jit(lambda params, images: model.apply({'params': params}, images))


def _images(size=SIZE):
  return np.random.default_rng(7).normal(size=(2, size, size, 3)).astype(np.float32)


def _logits(name, params, size=SIZE, **overrides):
  return np.asarray(_apply_fn(name, **overrides)(params, _images(size)))


def _flat(params):
  return weights.flatten_params(params)


def _assert_trees_equal(actual, expected):
  """Same structure, and bitwise-equal float32 leaves."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual),
                          jax.tree.leaves(expected), strict=True):
    assert isinstance(a, np.ndarray) and a.dtype == np.float32, path
    np.testing.assert_array_equal(a, np.asarray(b), err_msg=jax.tree_util.keystr(path))


def _per_type_numbering(flat):
  """What current Flax writes: sub-modules numbered per type inside a block."""
  renames = {'/MultiHeadDotProductAttention_1/': '/MultiHeadDotProductAttention_0/',
             '/LayerNorm_2/': '/LayerNorm_1/', '/MlpBlock_3/': '/MlpBlock_0/'}
  out = {}
  for name, value in flat.items():
    for old, new in renames.items():
      name = name.replace(old, new)
    out[name] = value
  return out
