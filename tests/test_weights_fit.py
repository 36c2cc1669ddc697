"""vit_jax.weights.fit: a checkpoint fitted to another resolution, class count, pre_logits."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from weights_helpers import (NUM_CLASSES, SIZE, _assert_trees_equal, _logits, _model,
                             _random_params, _shapes)

from vit_jax import models, weights


@pytest.mark.parametrize('name, num_extra', [('ViT-testing', 1), ('DeiT-testing', 2)])
def test_other_resolution_resizes_position_embedding(name, num_extra, tmp_path, capsys):
  params = _random_params(name)
  path = tmp_path / 'params.npz'
  weights.save_npz(path, params)

  loaded = weights.load_pretrained(path, _shapes(name, size=24))  # 4x4 -> 6x6 grid.
  assert capsys.readouterr().out == (f'{path} fitted to the model: position embedding resized '
                                     'from a 4x4 grid to 6x6.\n')

  old = params['Transformer']['posembed_input']['pos_embedding']
  new = loaded['Transformer']['posembed_input']['pos_embedding']
  assert new.shape == (1, num_extra + 36, 32)
  np.testing.assert_array_equal(new[:, :num_extra], old[:, :num_extra])
  expected_grid = jax.image.resize(old[0, num_extra:].reshape(4, 4, 32), (6, 6, 32),
                                   method='bilinear', antialias=False)
  np.testing.assert_allclose(new[0, num_extra:].reshape(6, 6, 32), expected_grid,
                             atol=1e-6)
  for key in ('cls', 'embedding', 'head'):  # Everything else is unchanged.
    _assert_trees_equal(loaded[key], params[key])
  _assert_trees_equal(loaded['Transformer']['encoderblock_1'],
                      params['Transformer']['encoderblock_1'])
  logits = _logits(name, loaded, size=24)
  assert logits.shape == (2, NUM_CLASSES) and np.all(np.isfinite(logits))


def test_resize_posemb_identity_and_downsampling():
  posemb = np.random.default_rng(0).normal(size=(1, 1 + 36, 8)).astype(np.float32)
  np.testing.assert_array_equal(weights.resize_posemb(posemb, 1, (6, 6)), posemb)
  small = weights.resize_posemb(posemb, 1, (4, 3))
  expected = jax.image.resize(posemb[0, 1:].reshape(6, 6, 8), (4, 3, 8), method='bilinear',
                              antialias=False)
  np.testing.assert_allclose(small[0, 1:].reshape(4, 3, 8), expected, atol=1e-6)
  with pytest.raises(ValueError, match='not a square grid'):
    weights.resize_posemb(posemb[:, :-1], 1, (4, 4))


def test_head_follows_class_count(tmp_path, capsys):
  params = _random_params('ViT-testing')
  path = tmp_path / 'params.npz'
  weights.save_npz(path, params)
  model = _model('ViT-testing', num_classes=5)
  init = jax.jit(model.init)(jax.random.PRNGKey(1), jnp.zeros((1, SIZE, SIZE, 3)))['params']
  assert not np.any(init['head']['kernel'])  # The model's own head is zero-initialised.

  capsys.readouterr()
  other = weights.load_pretrained(path, init)
  assert capsys.readouterr().out == (  # Said, so that a wrong class count is seen.
      f'{path} fitted to the model: head initialised afresh (the file has {NUM_CLASSES} '
      'classes, the model 5).\n')
  _assert_trees_equal(other['head'], init['head'])
  _assert_trees_equal(other['Transformer'], params['Transformer'])

  features_only = weights.load_pretrained(path, _shapes('ViT-testing', num_classes=0))
  assert 'head' not in features_only  # A model without a head drops the file's.
  _assert_trees_equal(features_only['embedding'], params['embedding'])

  fresh = _random_params('ViT-testing', seed=1)  # Stands in for an initialised model.
  same = weights.load_pretrained(path, fresh)
  _assert_trees_equal(same['head'], params['head'])
  forced = weights.load_pretrained(path, fresh, reinit_head=True)
  _assert_trees_equal(forced['head'], fresh['head'])
  _assert_trees_equal(forced['cls'], params['cls'])


def test_pre_logits_dropped_or_kept(tmp_path):
  with_repr = _random_params('ViT-testing', seed=1, representation_size=32)
  without_repr = _random_params('ViT-testing')
  path = tmp_path / 'with_pre_logits.npz'
  weights.save_npz(path, with_repr)

  # File has pre_logits, model not: dropped; the head (trained on top of it) is re-initialised
  # even though its shape matches.
  loaded = weights.load_pretrained(path, without_repr)
  assert 'pre_logits' not in loaded
  _assert_trees_equal(loaded['head'], without_repr['head'])
  _assert_trees_equal(loaded['Transformer'], with_repr['Transformer'])

  # File lacks pre_logits, model has it: the model's own pre_logits and head are kept.
  path = tmp_path / 'without_pre_logits.npz'
  weights.save_npz(path, without_repr)
  loaded = weights.load_pretrained(path, with_repr)
  _assert_trees_equal(loaded['pre_logits'], with_repr['pre_logits'])
  _assert_trees_equal(loaded['head'], with_repr['head'])
  _assert_trees_equal(loaded['embedding'], without_repr['embedding'])

  # The shapes alone cannot provide a head: a clear error asks for real init params.
  with pytest.raises(ValueError, match='only its shape'):
    weights.load_pretrained(path, _shapes('ViT-testing', representation_size=32))


def test_other_architecture_lists_mismatches(tmp_path):
  path = tmp_path / 'vit_testing.npz'
  weights.save_npz(path, _random_params('ViT-testing'))

  wider = _shapes('ViT-testing', hidden_size=48, mlp_dim=96)
  with pytest.raises(ValueError, match='file vs model') as error:
    weights.load_pretrained(path, wider)
  message = str(error.value)
  assert str(path) in message
  assert 'embedding/kernel: (4, 4, 3, 32) vs (4, 4, 3, 48)' in message
  assert re.search(r'; and \d+ more\)', message)  # Only the first few are listed.

  deeper = _shapes('ViT-testing', num_layers=3)
  with pytest.raises(ValueError, match=r'encoderblock_2/\S+: missing vs \(32,\)'):
    weights.load_pretrained(path, deeper)
  with pytest.raises(ValueError, match=r"dist: missing vs \(1, 1, 32\)"):
    weights.load_pretrained(path, _shapes('DeiT-testing'))
  with pytest.raises(ValueError, match='embedding/kernel: .* vs'):
    weights.from_timm(weights.to_timm(_random_params('ViT-testing')), wider)


def test_weights_of_another_kind_of_model_are_named_as_such(tmp_path):
  # A seq2seq Transformer's file listed 123 'missing vs' rows and asked for the ViT's width.
  translator = models.get_model('Transformer-testing', vocab_size=20)
  tokens = jnp.ones((1, 4), jnp.int32)
  path = tmp_path / 'translator.npz'
  weights.save_npz(path, translator.init(jax.random.key(0), tokens, tokens)['params'])
  with pytest.raises(ValueError) as error:
    weights.load_pretrained(path, _shapes('ViT-testing'))
  assert str(error.value) == (
      f"{path} shares no parameter with the model: it holds a seq2seq Transformer's weights "
      '(top-level names decoder, encoder, shared_embedding), the model has Transformer, cls, '
      'embedding, head. Give a checkpoint of the model named in the config.')
