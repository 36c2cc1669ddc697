"""vit_jax.weights.timm: timm state_dicts, exactly both ways and against timm itself."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from weights_helpers import (MODELS, NUM_CLASSES, POSEMB, SIZE, _assert_trees_equal, _flat,
                             _images, _logits, _random_params, _shapes)

from vit_jax import models, weights
from vit_jax.models import model_config


@pytest.mark.parametrize('name', MODELS)
def test_timm_round_trip_is_exact(name, tmp_path):
  params = _random_params(name)
  flat = _flat(params)
  path = tmp_path / 'model.safetensors'
  weights.save_safetensors(path, weights.to_timm(params))
  state_dict = weights.load_safetensors(path)

  attn = 'Transformer/encoderblock_1/MultiHeadDotProductAttention_1/'
  query = flat[attn + 'query/kernel']  # (D, N, H)
  assert state_dict['blocks.1.attn.qkv.weight'].shape == (3 * 32, 32)
  np.testing.assert_array_equal(state_dict['blocks.1.attn.qkv.weight'][:32],
                                query.reshape(32, 32).T)
  np.testing.assert_array_equal(state_dict['blocks.1.attn.proj.weight'],
                                flat[attn + 'out/kernel'].reshape(32, 32).T)
  np.testing.assert_array_equal(state_dict['patch_embed.proj.weight'],
                                flat['embedding/kernel'].transpose(3, 2, 0, 1))
  np.testing.assert_array_equal(state_dict['head.weight'], flat['head/kernel'].T)
  assert state_dict['pos_embed'].shape == flat[POSEMB].shape
  if name == 'DeiT-testing':
    assert {'dist_token', 'head_dist.weight', 'head_dist.bias'} <= set(state_dict)
  if name == 'R+ViT-testing':
    assert state_dict['patch_embed.backbone.stem.conv.weight'].shape == (32, 3, 7, 7)
    assert 'patch_embed.backbone.stages.1.blocks.0.downsample.conv.weight' in state_dict
    assert 'patch_embed.backbone.stages.0.blocks.0.norm3.bias' in state_dict

  _assert_trees_equal(weights.from_timm(state_dict, _shapes(name)), params)


def test_stem_only_hybrid_uses_timm_bare_stem_names():
  params = _random_params('R+ViT-Ti_16', size=32, num_layers=1)  # 32 = stem stride x patch.
  state_dict = weights.to_timm(params)
  assert 'patch_embed.backbone.conv.weight' in state_dict  # As timm's vit_tiny_r_s16_p8.
  assert not any('.stem.' in name for name in state_dict)
  _assert_trees_equal(
      weights.from_timm(state_dict, _shapes('R+ViT-Ti_16', size=32, num_layers=1)), params)


# Against timm itself (only where torch and timm are installed).


def _timm_model(name, num_classes, size):
  """The timm model with our architecture and our numerics (tanh GELU, Flax eps)."""
  torch = pytest.importorskip('torch')
  timm = pytest.importorskip('timm')
  layers, vit_models = timm.layers, timm.models

  config = model_config(name)
  kwargs = dict(img_size=size, patch_size=config['patch_size'][0],
                embed_dim=config['hidden_size'], depth=config['num_layers'],
                num_heads=config['num_heads'],
                mlp_ratio=config['mlp_dim'] / config['hidden_size'],
                num_classes=num_classes,
                act_layer=functools.partial(torch.nn.GELU, approximate='tanh'))
  if config.get('resnet_layers') is not None:
    backbone = vit_models.resnetv2.ResNetV2(
        layers=config['resnet_layers'], num_classes=0, global_pool='', preact=False,
        stem_type='same', width_factor=config.get('resnet_width_factor', 1),
        conv_layer=functools.partial(layers.StdConv2dSame, eps=1e-5),  # timm's hybrids: 1e-8.
        norm_layer=functools.partial(layers.GroupNormAct, num_groups=32, eps=1e-6))
    kwargs['embed_layer'] = functools.partial(layers.HybridEmbed, backbone=backbone)
  if config.get('classifier') == 'token_distill':
    return vit_models.deit.VisionTransformerDistilled(**kwargs).eval()
  return vit_models.vision_transformer.VisionTransformer(**kwargs).eval()


@pytest.mark.parametrize('name', MODELS)
def test_timm_model_gives_the_same_logits(name, tmp_path):
  torch = pytest.importorskip('torch')
  timm_model = _timm_model(name, NUM_CLASSES, SIZE)
  params = _random_params(name)
  path = tmp_path / 'model.safetensors'
  weights.save_safetensors(path, weights.to_timm(params))

  state_dict = {k: torch.from_numpy(v) for k, v in weights.load_safetensors(path).items()}
  timm_model.load_state_dict(state_dict, strict=True)
  with torch.no_grad():
    theirs = timm_model(torch.from_numpy(_images()).permute(0, 3, 1, 2)).numpy()

  np.testing.assert_allclose(theirs, _logits(name, params), atol=1e-4)
  _assert_trees_equal(
      weights.from_timm({k: v.numpy() for k, v in timm_model.state_dict().items()},
                        _shapes(name)), params)


def test_a_seq2seq_transformer_has_no_timm_layout():
  translator = models.get_model('Transformer-testing', vocab_size=20)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = translator.init(jax.random.key(0), tokens, tokens)['params']
  with pytest.raises(ValueError, match=r"^These are a seq2seq Transformer's weights, which timm "
                                       r'has no model for: convert them to \.npz or to an orbax '
                                       r'directory instead\.$'):
    weights.to_timm(params)
