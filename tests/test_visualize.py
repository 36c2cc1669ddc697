"""Attention extraction, rollout, the plots, and trainer=visualize."""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from vit_jax import models, visualize
from vit_jax.models import layers

# ------------------------------------------------------------------------------ rollout


def _layers_of(matrix: np.ndarray, num_layers: int, batch: int = 2, heads: int = 3):
  """(T, T) -> the same attention in every layer, batch row and head: (L, B, N, T, T)."""
  return np.broadcast_to(matrix, (num_layers, batch, heads, *matrix.shape)).copy()


@pytest.mark.parametrize('add_residual', [False, True])
def test_rollout_of_identity_attention_is_the_identity(add_residual):
  rollout = visualize.attention_rollout(_layers_of(np.eye(5), 4), add_residual=add_residual)
  assert rollout.shape == (2, 5, 5)
  np.testing.assert_allclose(rollout, np.broadcast_to(np.eye(5), (2, 5, 5)), atol=1e-12)


def test_rollout_of_uniform_attention_is_uniform():
  uniform = np.full((6, 6), 1 / 6)
  rollout = visualize.attention_rollout(_layers_of(uniform, 3), add_residual=False)
  np.testing.assert_allclose(rollout, np.full((2, 6, 6), 1 / 6), atol=1e-12)


def test_rollout_with_residual_of_uniform_attention_has_the_closed_form():
  # Each layer is (U + I) / 2 with U idempotent, so L layers give (1 - 2^-L) U + 2^-L I.
  num_layers, tokens = 3, 4
  uniform = np.full((tokens, tokens), 1 / tokens)
  rollout = visualize.attention_rollout(_layers_of(uniform, num_layers))
  expected = (1 - 0.5**num_layers) * uniform + 0.5**num_layers * np.eye(tokens)
  np.testing.assert_allclose(rollout[0], expected, atol=1e-12)
  np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-12)  # Rows stay distributions.


def test_rollout_multiplies_later_layers_on_the_left():
  rng = np.random.default_rng(0)
  first, second = rng.dirichlet(np.ones(4), size=4), rng.dirichlet(np.ones(4), size=4)
  weights = np.stack([_layers_of(first, 1, batch=1, heads=1)[0],
                      _layers_of(second, 1, batch=1, heads=1)[0]])
  rollout = visualize.attention_rollout(weights, add_residual=False)
  np.testing.assert_allclose(rollout[0], second @ first, atol=1e-12)


def test_head_fusion_and_its_errors():
  weights = np.zeros((1, 1, 2, 2, 2))
  weights[0, 0, 0] = [[1, 0], [0, 1]]
  weights[0, 0, 1] = [[0, 1], [1, 0]]
  np.testing.assert_allclose(visualize.fuse_heads(weights, 'mean')[0, 0], np.full((2, 2), 0.5))
  np.testing.assert_allclose(visualize.fuse_heads(weights, 'max')[0, 0], np.ones((2, 2)))
  with pytest.raises(ValueError, match="Unknown head_fusion 'median'.*'mean', 'max', 'min'"):
    visualize.attention_rollout(weights, head_fusion='median')
  with pytest.raises(ValueError, match=r'\(layers, batch, heads, T, T\).*\(2, 2\)'):
    visualize.attention_rollout(np.eye(2))


# ------------------------------------------------------------------------------ maps


def test_class_token_map_puts_each_patch_where_it_is_in_the_image():
  # 1 class token + a 2x3 grid of patches; the class token attends only to patch 4 (row 1, col 1).
  weights = np.zeros((2, 1, 1, 7, 7))
  weights[..., 0, 1 + 4] = 1.0
  maps = visualize.class_token_maps(weights, layer=-1, num_prefix_tokens=1, grid_shape=(2, 3))
  assert maps.shape == (1, 1, 2, 3)
  expected = np.zeros((2, 3))
  expected[1, 1] = 1.0
  np.testing.assert_array_equal(maps[0, 0], expected)
  with pytest.raises(ValueError, match='layer=2 is out of range for a model with 2 layers'):
    visualize.class_token_maps(weights, layer=2, grid_shape=(2, 3))
  with pytest.raises(ValueError, match='6 patch tokens do not form a square grid'):
    visualize.class_token_maps(weights)
  with pytest.raises(ValueError, match=r'grid_shape \(3, 3\) does not hold the 6 patch tokens'):
    visualize.rollout_maps(weights, grid_shape=(3, 3))


def test_gap_models_map_the_mean_attention_of_all_tokens():
  weights = np.zeros((1, 1, 1, 4, 4))
  weights[0, 0, 0, :, 2] = 1.0  # Every token attends to token 2.
  maps = visualize.class_token_maps(weights, num_prefix_tokens=0)
  np.testing.assert_array_equal(maps[0, 0], [[0, 0], [1, 0]])


# ------------------------------------------------------------------------------ extraction


def _vit(name='ViT-testing', **settings):
  model = models.get_model(name, num_classes=10, **settings)
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
  params = model.init(jax.random.PRNGKey(0), images)['params']
  return model, params, images


def test_vit_attention_weights_and_logits():
  model, params, images = _vit()
  logits, weights = visualize.vit_attention(model, params, images)
  # ViT-testing: 2 layers, 16x16 images with 4x4 patches -> 16 patches + the class token.
  assert weights.shape == (2, 2, model.num_heads, 17, 17)
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
  # The plain path used for extraction gives the model's own logits.
  np.testing.assert_allclose(logits, model.apply({'params': params}, images), atol=1e-5)
  assert visualize.class_token_maps(weights).shape == (2, model.num_heads, 4, 4)
  assert visualize.rollout_maps(weights).shape == (2, 4, 4)


def test_scanned_layers_give_the_same_weights_as_the_unrolled_stack():
  model, params, images = _vit()
  _, unrolled = visualize.vit_attention(model, params, images)
  scanned_model = model.clone(scan_layers=True)
  scanned_params = layers.stack_layers(params)
  _, scanned = visualize.vit_attention(scanned_model, scanned_params, images)
  np.testing.assert_allclose(scanned, unrolled, atol=1e-5)


def test_deit_maps_skip_the_distillation_token():
  model, params, images = _vit('DeiT-testing')
  _, weights = visualize.vit_attention(model, params, images)
  assert visualize.num_prefix_tokens(model) == 2
  assert weights.shape[-1] == 18  # Class + distillation tokens + 16 patches.
  maps = visualize.class_token_maps(weights, num_prefix_tokens=2)
  np.testing.assert_allclose(maps, weights[-1, :, :, 0, 2:].reshape(maps.shape))


def test_cross_attention_of_the_transformer():
  model = models.get_model('Transformer-testing', vocab_size=20)
  inputs = jnp.array([[5, 6, 7, 1, 0, 0], [8, 9, 1, 0, 0, 0]], jnp.int32)
  targets = jnp.array([[3, 4, 1, 0], [5, 1, 0, 0]], jnp.int32)
  params = model.init(jax.random.PRNGKey(0), inputs, targets)['params']
  weights = visualize.cross_attention(model, params, inputs, targets)
  assert weights.shape == (model.num_layers, 2, model.num_heads, 4, 6)
  np.testing.assert_allclose(weights[:, 0, :, :3].sum(-1), 1.0, atol=1e-5)
  assert np.all(weights[:, 0, :, :3, 4:] < 1e-6)  # Source padding gets no attention.


def test_token_labels_stop_at_eos():
  class Chars:
    def decode(self, ids):
      return ''.join(' abc'[i - 2] for i in ids if i > 1)  # 2: space, 3: a, 4: b.
  assert visualize.token_labels(Chars(), [3, 2, 4, 1, 3, 0]) == ['a', '␣', 'b', '</s>']


# ------------------------------------------------------------------------------ plots


def _texts(figure):
  return {text for ax in figure.axes
          for text in (ax.get_xlabel(), ax.get_ylabel(), ax.get_title())}


def _is_png(path):
  with Image.open(path) as image:
    return image.format == 'PNG' and image.size[0] > 100


def test_attention_map_figure_has_image_labels_and_colour_bars(tmp_path):
  rng = np.random.default_rng(0)
  image = rng.uniform(-1, 1, (16, 16, 3))
  heads = rng.dirichlet(np.ones(16), size=3).reshape(3, 4, 4)
  figure = visualize.plot_attention_maps(image, heads, heads.mean(0), layer=1, title='cat')
  texts = _texts(figure)
  assert {'input', 'layer 1, head 0', 'layer 1, head 2', 'rollout, all layers'} <= texts
  assert {'x (pixels)', 'y (pixels)', 'class-token attention', 'rollout weight'} <= texts
  overlays = [ax for ax in figure.axes if ax.get_title().startswith('layer')]
  assert all(len(ax.images) == 2 for ax in overlays)  # The map drawn over the image.
  path = visualize.save_figure(figure, str(tmp_path / 'maps' / 'attention.png'))
  assert _is_png(path)


def test_cross_attention_figure_has_tokens_on_the_axes(tmp_path):
  figure = visualize.plot_cross_attention(np.full((2, 3), 1 / 3), ['a', 'b', '</s>'],
                                          ['x', '</s>'])
  ax = figure.axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == ['a', 'b', '</s>']
  assert [t.get_text() for t in ax.get_yticklabels()] == ['x', '</s>']
  assert {'source tokens (encoder)', 'output tokens (decoder)', 'attention weight'} <= _texts(
      figure)
  assert _is_png(visualize.save_figure(figure, str(tmp_path / 'cross.png')))
  with pytest.raises(ValueError, match=r'shape \(2, 3\) do not match 2 output and 2 source'):
    visualize.plot_cross_attention(np.zeros((2, 3)), ['a', 'b'], ['x', 'y'])


def test_training_curves_from_metrics_jsonl(tmp_path):
  rows = [{'step': 10, 'split': 'train', 'loss': 2.0, 'learning_rate': 1e-3, 'eta': 5.0},
          {'step': 20, 'split': 'train', 'loss': 1.0, 'learning_rate': 5e-4, 'eta': 0.0},
          {'step': 20, 'split': 'test', 'loss': 1.2, 'accuracy': 0.7, 'num_examples': 360}]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  figure = visualize.plot_training_curves(str(tmp_path))
  assert [ax.get_ylabel() for ax in figure.axes] == ['loss', 'accuracy', 'learning rate']
  assert [line.get_label() for line in figure.axes[0].lines] == ['train', 'test']
  assert all(ax.get_xlabel() == 'step' for ax in figure.axes)
  assert _is_png(visualize.save_figure(figure, str(tmp_path / 'curves.png')))
  with pytest.raises(FileNotFoundError, match='No metrics at'):
    visualize.plot_training_curves(str(tmp_path / 'missing'))


def test_predictions_figure_names_the_top_classes():
  logits = np.log(np.array([[0.1, 0.6, 0.3]]))
  ids, probs = visualize.top_k(logits, 2)
  assert ids.tolist() == [[1, 2]] and np.allclose(probs, [[0.6, 0.3]])
  figure = visualize.plot_predictions(np.zeros((1, 8, 8, 1)), logits, ['a', 'b', 'c'], [1])
  bars = figure.axes[1]
  top_down = sorted(bars.get_yticklabels(), key=lambda t: -t.get_position()[1])
  assert [t.get_text() for t in top_down] == ['b', 'c', 'a']  # Best at the top.
  assert bars.get_xlabel() == 'probability'


@pytest.mark.parametrize('mean, std', [(0.5, 0.5), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
def test_figures_show_the_pixels_whatever_the_inputs_statistics(mean, std):
  pixels = np.random.RandomState(0).randint(0, 256, (1, 8, 8, 3))
  inputs = (pixels / 255 - np.array(mean)) / np.array(std)  # As the data config normalizes.
  figure = visualize.plot_predictions(inputs, np.zeros((1, 3)), pixel_mean=mean, pixel_std=std)
  np.testing.assert_allclose(figure.axes[0].images[0].get_array(), pixels[0] / 255, atol=1e-5)
  figure = visualize.plot_attention_maps(inputs[0], np.ones((2, 2, 2)), np.ones((2, 2)),
                                         pixel_mean=mean, pixel_std=std)
  for ax in figure.axes[:4]:  # The input, two heads, the rollout: each over the same pixels.
    np.testing.assert_allclose(ax.images[0].get_array(), pixels[0] / 255, atol=1e-5)


def test_visualize_image_files_and_missing_checkpoint(tmp_path, capsys, monkeypatch):
  from test_train import tiny_config  # pylint: disable=g-import-not-at-top
  from vit_jax import main, progress  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  with pytest.raises(FileNotFoundError, match='No checkpoint in .* Train first'):
    main.run(tiny_config(trainer='visualize'), workdir)
  main.run(tiny_config(total_steps=5, eval_every=0), workdir)
  # The curves of what the trainer logs: not its speed, counts or memory.
  figure = visualize.plot_training_curves(workdir)
  assert [ax.get_ylabel() for ax in figure.axes] == ['loss', 'accuracy', 'learning rate']
  visualize.save_figure(figure, str(tmp_path / 'curves.png'))
  image_path = str(tmp_path / 'seven.png')
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 24), np.uint8)).save(image_path)
  output_dir = str(tmp_path / 'pictures')
  paths = main.run(tiny_config(trainer='visualize', **{
      'visualize.inputs': image_path, 'visualize.layer': 0,
      'visualize.output_dir': output_dir}), workdir)
  assert sorted(os.path.basename(p) for p in paths) == [
      'attention_0.png', 'predictions.png', 'training_curves.png']
  assert all(_is_png(p) and p.startswith(output_dir) for p in paths)
  # Without inputs: the first test digits, with their labels in the titles. Drawing takes about
  # half a second a picture: 400 of them worked for minutes without a word.
  monkeypatch.setattr(progress, 'SLOW_SECONDS', 0.0)
  capsys.readouterr()
  paths = main.run(tiny_config(trainer='visualize', **{'visualize.num_examples': 2}), workdir)
  assert re.search(r'^Drawing the attention maps of 2 image\(s\): 2 of 2 images in [\d.]+s\.$',
                   capsys.readouterr().err, re.M)
  monkeypatch.undo()
  assert sorted(os.path.relpath(p, workdir) for p in paths) == [
      'visualize/attention_0.png', 'visualize/attention_1.png', 'visualize/predictions.png',
      'visualize/training_curves.png']
  # Data whose labels mean other classes than the run's: its titles would name wrong labels.
  from vit_jax.data import make_image_folder  # pylint: disable=g-import-not-at-top
  folder = tmp_path / 'renamed'
  make_image_folder.make(str(folder), size=16, train_size=40, test_size=10)
  for split in ('train', 'test'):
    (folder / split / '0').rename(folder / split / 'zero')
  with pytest.raises(ValueError, match=r"'\S+renamed' \(10 classes\) does not label its classes "
                     r"as the run in \S+ learnt them .*label 0 is '1' in the data, '0' in the run"):
    main.run(tiny_config(trainer='visualize', **{'data.dataset': str(folder)}), workdir)
  with pytest.raises(ValueError, match='visualize.layer=5 is out of range .* 2 layers'):
    main.run(tiny_config(trainer='visualize', **{'visualize.layer': 5}), workdir)
  with pytest.raises(FileNotFoundError, match="Image file 'nope.png' does not exist"):
    main.run(tiny_config(trainer='visualize', **{'visualize.inputs': 'nope.png'}), workdir)
  with pytest.raises(ValueError, match=r"visualize.inputs=' \| ' names nothing between its '\|' "
                     'separators'):  # Not the test examples that '' draws.
    main.run(tiny_config(trainer='visualize', **{'visualize.inputs': ' | '}), workdir)
  with pytest.raises(ValueError, match=r"Image file '\S+pictures' is a directory; give image "):
    main.run(tiny_config(trainer='visualize', **{'visualize.inputs': output_dir}), workdir)


def test_drawing_test_images_of_a_cached_run_decodes_one_batch_and_says_nothing(tmp_path, capfd):
  """With config.data.cache, the pictures' one batch came from a cache of the whole test split
  that TensorFlow filled, then discarded with a warning on stderr."""
  from test_train import tiny_config  # pylint: disable=g-import-not-at-top
  from vit_jax import main  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  main.run(tiny_config(total_steps=1, eval_every=0, **{'data.cache': True}), workdir)
  capfd.readouterr()
  paths = main.run(tiny_config(trainer='visualize', **{'visualize.num_examples': 2,
                                                       'data.cache': True}), workdir)
  assert len(paths) == 4
  assert 'cache' not in capfd.readouterr().err


def test_an_output_dir_that_cannot_be_made_stops_before_the_model_runs(tmp_path):
  from vit_jax.train import config as config_lib, visualization  # pylint: disable=g-import-not-at-top
  (tmp_path / 'notes.txt').write_text('a file where a directory would go\n')
  config = config_lib.classification_config('ViT-testing')
  config.trainer = 'visualize'
  config.visualize.output_dir = str(tmp_path / 'notes.txt' / 'pictures')
  # No checkpoint in the workdir either: the output directory is checked first (a
  # FileNotFoundError traceback once the pictures were drawn, before).
  with pytest.raises(ValueError,
                     match=r'Cannot write .*notes\.txt/pictures: Not a directory \(.*notes\.txt\); '
                           r'choose a path'):
    visualization.run(config, str(tmp_path / 'no_run'))
  assert not (tmp_path / 'no_run').exists()  # Nothing is made for a run that is not there.
