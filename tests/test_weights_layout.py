"""vit_jax.weights.layout: the variants of the published layout load alike."""

import jax
import numpy as np
import pytest
from weights_helpers import (_assert_trees_equal, _flat, _logits, _per_type_numbering,
                             _random_params, _shapes)

from vit_jax import weights
from vit_jax.models import stack_layers


def _groupnorm_quirk(flat):
  """Older hybrid files store GroupNorm scale/bias as (1, 1, 1, C)."""
  def is_groupnorm(name):
    folders = name.split('/')[:-1]
    return bool(folders) and folders[-1].startswith('gn')
  return {name: value.reshape(1, 1, 1, -1) if is_groupnorm(name) else value
          for name, value in flat.items()}


def _stacked(flat):
  stacked = stack_layers(weights.unflatten_params(flat))  # The models' own helper.
  return {name: np.asarray(value) for name, value in _flat(stacked).items()}


VARIANTS = {
    'old_numbering_groupnorm_quirk': ('R+ViT-testing', _groupnorm_quirk,
                                      'block1/unit1/gn1/scale'),
    'per_type_numbering': ('DeiT-testing', _per_type_numbering,
                           'Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel'),
    'stacked': ('ViT-testing', _stacked, 'Transformer/encoderblock/LayerNorm_2/scale'),
    'stacked_per_type_numbering': ('ViT-testing', lambda f: _per_type_numbering(_stacked(f)),
                                   'Transformer/encoderblock/LayerNorm_1/scale'),
    # flax.optim's checkpoints: the params under 'opt/target/', beside the optimizer's state.
    'optimizer_target': ('ViT-testing', lambda f: {
        **{f'opt/target/{n}': v for n, v in f.items()},
        'opt/state/step': np.array(7), 'opt/state/param_states/cls/grad_ema': f['cls']},
                         'opt/target/Transformer/encoderblock_0/LayerNorm_0/scale'),
}


@pytest.mark.parametrize('variant', VARIANTS)
def test_layout_variants_load_to_the_same_logits(variant, tmp_path):
  name, rewrite, marker = VARIANTS[variant]
  params = _random_params(name)
  variant_flat = rewrite(_flat(params))
  assert marker in variant_flat  # The file really is in the variant layout.
  path = tmp_path / f'{variant}.npz'
  np.savez(path, **variant_flat)

  loaded = weights.load_pretrained(path, _shapes(name))

  _assert_trees_equal(loaded, params)
  np.testing.assert_array_equal(_logits(name, loaded), _logits(name, params))


def test_scanned_model_loads_per_layer_file_and_back(tmp_path):
  params = _random_params('ViT-testing')
  path = tmp_path / 'per_layer.npz'
  weights.save_npz(path, params)
  scanned_shapes = _shapes('ViT-testing', scan_layers=True)

  scanned = weights.load_pretrained(path, scanned_shapes)

  assert jax.tree.structure(scanned) == jax.tree.structure(scanned_shapes)
  assert scanned['Transformer']['encoderblock']['LayerNorm_0']['scale'].shape == (2, 32)
  np.testing.assert_allclose(_logits('ViT-testing', scanned, scan_layers=True),
                             _logits('ViT-testing', params), rtol=1e-5, atol=1e-6)
  # Back to per-layer (and to timm) from the scanned tree.
  _assert_trees_equal(weights.load_pretrained(scanned, _shapes('ViT-testing')), params)
  timm_from_scanned = weights.to_timm(scanned)
  for key, value in weights.to_timm(params).items():
    np.testing.assert_array_equal(timm_from_scanned[key], value)


def test_unstack_blocks_refuses_mixed_or_ragged_stacks():
  stacked = {'Transformer/encoderblock/LayerNorm_0/scale': np.ones((2, 4), np.float32)}
  assert list(weights.unstack_blocks(stacked)) == [
      f'Transformer/encoderblock_{i}/LayerNorm_0/scale' for i in range(2)]
  with pytest.raises(ValueError, match='both stacked'):
    weights.unstack_blocks({**stacked, 'Transformer/encoderblock_0/LayerNorm_0/bias': np.ones(4)})
  with pytest.raises(ValueError, match='disagree on the number of layers'):
    weights.unstack_blocks({**stacked,
                            'Transformer/encoderblock/LayerNorm_0/bias': np.ones((3, 4))})


def test_posemb_side_counts_the_grid_after_the_prefix_tokens():
  flat = weights.canonicalize(_random_params('DeiT-testing'))  # cls, dist and a 4x4 grid.
  assert weights.num_prefix_tokens(flat) == 2 and weights.posemb_side(flat) == 4
  assert weights.posemb_side({weights.POSEMB: np.zeros((1, 12, 8))}) is None  # Not square.
  assert weights.posemb_side({}) is None
