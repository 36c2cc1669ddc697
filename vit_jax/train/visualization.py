"""`trainer=visualize`: attention maps and training curves of a run, written as PNGs.

  python -m vit_jax.main --workdir=runs/digits --config.trainer=visualize \
      [--config.visualize.inputs='cat.jpg|dog.png'] [--config.visualize.layer=-1]

Classification: per image, the class token's attention in each head of one layer and the
attention rollout over all layers, overlaid on the image (attention_{i}.png), and the
top-5 classes (predictions.png). Translation: the encoder-decoder attention of each
translation with the tokens on the axes (cross_attention_{i}.png). Both: the training
curves from WORKDIR/metrics.jsonl (training_curves.png).
"""

import os

import ml_collections

from vit_jax import errors, files, progress, visualize
from vit_jax.data import class_names
from vit_jax.train import config as train_config, prediction


def _split_inputs(inputs: str) -> list[str]:
  """config.visualize.inputs as its items; [] for '' (draw test examples)."""
  items = [item.strip() for item in inputs.split('|') if item.strip()]
  if inputs.strip() and not items:
    raise errors.ConfigError(f'config.visualize.inputs={inputs!r} names nothing between its '
                             "'|' separators: give image files or sentences, e.g. "
                             "--config.visualize.inputs='cat.jpg|dog.png', or leave it empty "
                             'to draw test examples.')
  return items


def _checked_layer(layer: int, num_layers: int) -> int:
  """config.visualize.layer as an index in 0..num_layers-1 (negative: from the last)."""
  if not -num_layers <= layer < num_layers:
    layers = f'{num_layers} layer{"s" * (num_layers != 1)}'
    raise errors.ConfigError(f'config.visualize.layer={layer} is out of range for a model with '
                             f'{layers} (use 0..{num_layers - 1}, or -1 for the last).')
  return layer % num_layers


def _image_attention(config, workdir: str, output_dir: str) -> list[str]:
  from vit_jax.data import images as image_data  # pylint: disable=g-import-not-at-top
  model, params, _ = prediction.load_model_and_params(config, workdir)
  files = _split_inputs(config.visualize.inputs)
  if files:  # No dataset: the files, read and preprocessed like test images.
    inputs, labels = image_data.load_files(files, config.data), None
  else:
    # One batch is drawn: caching the test split (config.data.cache) would decode it all.
    dataset = image_data.build({**config.data.to_dict(), 'cache': False})
    if dataset.class_names:  # Its labels are titled with the run's names.
      class_names.check_learnt(workdir, dataset.class_names, config.data.dataset)
    batch = next(dataset.eval_batches(config.visualize.num_examples))
    count = int(batch['mask'].sum())
    inputs, labels = batch['image'][:count], batch['label'][:count]
  logits, weights = visualize.vit_attention(model, params, inputs)
  layer = _checked_layer(config.visualize.layer, weights.shape[0])
  prefix = visualize.num_prefix_tokens(model)
  head_maps = visualize.class_token_maps(weights, layer, prefix)  # Images are square.
  rollouts = visualize.rollout_maps(weights, prefix)
  names = prediction.class_names(config, workdir, model.num_classes)
  class_ids, probs = visualize.top_k(logits, 1)
  stats = {'pixel_mean': config.data.pixel_mean, 'pixel_std': config.data.pixel_std}
  paths = []
  with progress.phase(f'Drawing the attention maps of {len(inputs)} image(s)', total=len(inputs),
                      unit='images') as phase:
    for i, image in enumerate(inputs):
      title = f'predicted {names[class_ids[i, 0]]} ({probs[i, 0]:.0%})'
      if labels is not None:
        title += f', label {names[labels[i]]}'
      figure = visualize.plot_attention_maps(image, head_maps[i], rollouts[i], layer, title,
                                             **stats)
      paths.append(visualize.save_figure(figure, os.path.join(output_dir, f'attention_{i}.png')))
      phase.advance()
    figure = visualize.plot_predictions(inputs, logits, names, labels, **stats)
    paths.append(visualize.save_figure(figure, os.path.join(output_dir, 'predictions.png')))
  return paths


def _cross_attention(config, workdir: str, output_dir: str) -> list[str]:
  from vit_jax.data import text  # pylint: disable=g-import-not-at-top
  from vit_jax.train import translation  # pylint: disable=g-import-not-at-top
  sentences = _split_inputs(config.visualize.inputs)
  if not sentences:
    pairs = text.build(config.data, workdir=workdir).eval_texts()
    sentences = [source for source, _ in pairs[:config.visualize.num_examples]]
  tokenizer, model, params = translation.load_model_and_params(config, workdir)
  translator = translation.Translator(model, params, tokenizer, config)
  inputs, outputs = translator.translate_ids(sentences)
  weights = visualize.cross_attention(model, params, inputs, outputs)  # (L, B, N, T, S)
  layer = _checked_layer(config.visualize.layer, weights.shape[0])
  paths = []
  with progress.phase(f'Drawing the cross-attention of {len(sentences)} sentence(s)',
                      total=len(sentences), unit='sentences') as phase:
    for i, sentence in enumerate(sentences):
      source = visualize.token_labels(tokenizer, inputs[i])
      output = visualize.token_labels(tokenizer, outputs[i])
      heat = weights[layer, i].mean(axis=0)[:len(output), :len(source)]  # Mean over heads.
      title = (f'{sentence!r} -> {tokenizer.decode([int(t) for t in outputs[i]])!r}\n'
               f'decoder layer {layer}, mean over heads')
      figure = visualize.plot_cross_attention(heat, source, output, title)
      paths.append(visualize.save_figure(figure,
                                         os.path.join(output_dir, f'cross_attention_{i}.png')))
      phase.advance()
  return paths


def run(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  """Writes the PNGs of the run in `workdir` to config.visualize.output_dir; their paths."""
  settings = train_config.visualize_config()  # Defaults for configs saved before it existed.
  settings.update(dict(config.get('visualize', {})))
  config = ml_collections.ConfigDict(config.to_dict())
  config.visualize = settings
  output_dir = settings.output_dir or os.path.join(workdir, 'visualize')
  if not files.is_remote(output_dir):  # Checked before the model runs; made when written.
    files.check_can_make_dir(output_dir)
  if config.task == 'classification':
    paths = _image_attention(config, workdir, output_dir)
  else:
    paths = _cross_attention(config, workdir, output_dir)
  if os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
    title = f'{config.model.name} on {config.data.dataset}'
    figure = visualize.plot_training_curves(workdir, title=title)
    paths.append(visualize.save_figure(figure, os.path.join(output_dir, 'training_curves.png')))
  for path in paths:
    progress.log(f'Wrote {path}')
  return paths
