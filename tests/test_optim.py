"""Optimizers from the config: an option that does not apply to the chosen one is an error;
layer-wise learning-rate decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import errors, models, weights
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


def test_an_unknown_state_dtype_is_an_error_that_names_the_choices():
  config = optim.default_config()
  config.state_dtype = 'foo'  # A TypeError traceback from numpy before.
  with pytest.raises(errors.ConfigError, match=r"state_dtype='foo'; choose one of \('float32', "
                                               r"'bfloat16'\)"):
    optim.make_optimizer(config, total_steps=10)


def test_adamw_decays_kernels_only():
  params = {'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}}
  config = optim.default_config()
  config.weight_decay, config.learning_rate, config.grad_clip_norm = 0.5, 1.0, 0.0
  tx, _ = optim.make_optimizer(config, total_steps=10)
  zeros = {'dense': {'kernel': jnp.zeros((2, 2)), 'bias': jnp.zeros(2)}}
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert float(updates['dense']['bias'][0]) == 0.0
  assert float(updates['dense']['kernel'][0, 0]) != 0.0


def _vit_params(name='ViT-testing', image_size=8, **fields):
  model = models.get_model(name, num_classes=10, **fields)
  return jax.jit(model.init)(jax.random.PRNGKey(0),
                             np.zeros((1, image_size, image_size, 3)))['params']


def _effective_learning_rates(params, layer_decay, **optimizer):
  """Per parameter: -update / (learning rate x gradient) of one plain SGD step."""
  config = optim.default_config()
  config.update(name='sgd', momentum=0.0, learning_rate=0.1, schedule='constant',
                grad_clip_norm=0.0, layer_decay=layer_decay, **optimizer)
  tx, _ = optim.make_optimizer(config, total_steps=10)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  return {name: -np.asarray(value) / 0.1
          for name, value in weights.flatten_params(updates).items()}


def test_layer_decay_gives_each_block_of_vit_testing_its_learning_rate():
  # ViT-testing has 2 blocks: the head x1, block 2 x0.75, block 1 x0.75^2, the embeddings
  # (patch embedding, class token, position embedding) x0.75^3.
  params = _vit_params()
  rates = _effective_learning_rates(params, 0.75)
  expected_by_prefix = {'head/': 1.0, 'Transformer/encoder_norm/': 1.0,
                        'Transformer/encoderblock_1/': 0.75,
                        'Transformer/encoderblock_0/': 0.5625,
                        'Transformer/posembed_input/': 0.421875, 'embedding/': 0.421875,
                        'cls': 0.421875}
  table = []
  for name, rate in rates.items():
    prefix = [p for p in expected_by_prefix if name.startswith(p)]
    assert len(prefix) == 1, name
    np.testing.assert_allclose(rate, expected_by_prefix[prefix[0]], rtol=1e-6, err_msg=name)
    table.append(f"{name:<70} {float(rate.flat[0]):.6f}")
  print('\n'.join(['per-parameter learning rate / base rate, ViT-testing, layer_decay 0.75:']
                  + table))
  assert len(rates) == 40
  assert optim.describe_layer_decay(params, 0.75) == (
      'Layer-wise learning-rate decay 0.75: embeddings x0.422, block 1 x0.562, block 2 x0.75, '
      'head x1.')


def test_layer_decay_of_scanned_blocks_equals_that_of_separate_ones():
  separate = _effective_learning_rates(_vit_params(), 0.5)
  scanned = _effective_learning_rates(_vit_params(scan_layers=True), 0.5)
  for name, rate in scanned.items():
    if 'encoderblock/' in name:
      for block in range(2):
        np.testing.assert_allclose(rate[block], separate[name.replace(
            'encoderblock/', f'encoderblock_{block}/')], rtol=1e-6)
    else:
      np.testing.assert_allclose(rate, separate[name], rtol=1e-6)


def test_layer_decay_puts_a_hybrids_resnet_stem_with_the_embeddings():
  rates = _effective_learning_rates(_vit_params('R+ViT-Ti_16', image_size=32), 0.5)
  np.testing.assert_allclose(rates['conv_root/kernel'], 0.5**13)
  np.testing.assert_allclose(rates['Transformer/encoderblock_11/LayerNorm_0/scale'], 0.5)


def test_layer_decay_scales_the_weight_decay_too():
  # AdamW's decoupled decay is part of the update, so it is scaled like the learning rate.
  params = _vit_params()
  config = optim.default_config()
  config.update(weight_decay=0.5, learning_rate=1.0, grad_clip_norm=0.0, layer_decay=0.5,
                schedule='constant')
  tx, _ = optim.make_optimizer(config, total_steps=10)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
  head, first = params['head']['kernel'], params['Transformer']['encoderblock_0']
  np.testing.assert_allclose(updates['Transformer']['encoderblock_0']['MlpBlock_3']['Dense_0'][
      'kernel'], -0.5 * 0.25 * first['MlpBlock_3']['Dense_0']['kernel'], rtol=1e-6)
  np.testing.assert_allclose(updates['head']['kernel'], -0.5 * head, rtol=1e-6)


def test_layer_decay_needs_vit_blocks_and_a_rate_in_range():
  with pytest.raises(errors.ConfigError, match='applies to ViT models'):
    optim.layer_depths({'encoder': {'kernel': np.zeros(2)}})
  config = optim.default_config()
  config.layer_decay = 1.5
  with pytest.raises(errors.ConfigError, match=r'layer_decay=1.5 must be in \(0, 1\]'):
    optim.make_optimizer(config, total_steps=10)


def test_the_trainer_applies_layer_decay_and_prints_its_table(tmp_path, capsys):
  # Two plain SGD steps from the same init on the same batches. The zero-initialised head
  # stops every gradient below it at step 1, and moves alike in both runs (x1), so each
  # parameter moves by its block's multiplier times what it moves without the decay.
  from vit_jax import main  # pylint: disable=g-import-not-at-top
  from vit_jax.train import checkpointing, classification  # pylint: disable=g-import-not-at-top
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  moved = {}
  for layer_decay in (1.0, 0.5):
    config = config_lib.classification_config('ViT-testing')
    config.model.patch_size = (4, 4)
    config.data.image_size = 8
    config.update(batch_size=32, eval_batch_size=360, total_steps=2, eval_every=0,
                  checkpoint_every=0, log_every=1)
    config.optimizer.update(name='sgd', momentum=0.0, schedule='constant', grad_clip_norm=0.0,
                            learning_rate=0.1, layer_decay=layer_decay)
    workdir = str(tmp_path / str(layer_decay))
    main.run(config, workdir)
    task = classification.ClassificationTask(config, workdir)
    init = weights.flatten_params(jax.device_get(jax.jit(task.init_params)(
        jax.random.split(jax.random.PRNGKey(config.seed))[0])))
    final = weights.flatten_params(checkpointing.restore_params(workdir)[0])
    moved[layer_decay] = {name: final[name] - init[name] for name in init}
  assert ('Layer-wise learning-rate decay 0.5: embeddings x0.125, block 1 x0.25, block 2 x0.5, '
          'head x1.') in capsys.readouterr().out
  scales = optim.layer_scales(_vit_params(patch_size=(4, 4)), 0.5)
  assert np.abs(moved[1.0]['Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel']).max() > 0
  for name, plain in moved[1.0].items():
    np.testing.assert_allclose(moved[0.5][name], scales[name] * plain, rtol=1e-4, atol=1e-7,
                               err_msg=name)
