"""See what a model attends to: attention maps, attention rollout, cross-attention, curves.

  logits, weights = visualize.vit_attention(model, params, images)  # weights (L, B, N, T, T)
  heads = visualize.class_token_maps(weights, layer=-1, num_prefix_tokens=1)  # (B, N, h, w)
  rollout = visualize.rollout_maps(weights, num_prefix_tokens=1)  # (B, h, w)
  figure = visualize.plot_attention_maps(images[0], heads[0], rollout[0], layer=-1)
  visualize.save_figure(figure, 'attention.png')

Extraction re-runs a model on its 'plain' attention path, which sows every layer's
weights into the 'intermediates' collection; parameters are used as they are.
Plots are matplotlib figures (matplotlib is imported on first use).
"""

import os
import re
from typing import Any, Sequence

import jax
import numpy as np
from flax import traverse_util

from vit_jax import errors, files, run_metrics
from vit_jax.data import normalization
from vit_jax.models.vit import PREFIX_TOKENS

HEAD_FUSIONS = ('mean', 'max', 'min')
# What a run logs that is not drawn as a training curve: speed, ETA, counts, memory.
_CURVE_SKIP = ('examples_per_sec', 'eta', 'data_wait_fraction', 'num_examples', 'num_decoded',
               'grad_norm', 'resident_bytes', 'peak_resident_bytes')


# ------------------------------------------------------------------------------ extraction


def collect_attention(model, params, *args, **kwargs) -> tuple[Any, dict[str, np.ndarray]]:
  """Runs `model.apply` on the plain attention path: its output and every layer's weights.

  Args:
    model: a vit_jax model with an `attention_impl` field (ViT, hybrid, DeiT, Transformer).
    params: its parameters.
    *args, **kwargs: the inputs of `model.apply` (images; or inputs and targets).

  Returns:
    (the model's output, {module path: weights (B, N, T, S)}); a scanned stack's weights
    are (L, B, N, T, S). Weights are float32 numpy arrays.
  """
  plain = model.clone(attention_impl='plain')
  output, state = plain.apply({'params': params}, *args, mutable=['intermediates'], **kwargs)
  found = {}
  for path, sown in traverse_util.flatten_dict(state.get('intermediates', {})).items():
    if path[-1] == 'attention_weights':
      found['/'.join(path[:-1])] = np.asarray(jax.device_get(sown[-1]), np.float32)
  if not found:
    raise ValueError(f'{type(model).__name__} sowed no attention weights; expected a vit_jax '
                     'model built from vit_jax.models.')
  return output, found


def _block_number(path: str, block: str) -> int:
  """i of `{block}_{i}` in a parameter path; -1 for a scanned stack (no number)."""
  match = re.search(rf'{block}_(\d+)', path)
  return int(match.group(1)) if match else -1


def stack_by_layer(weights: dict[str, np.ndarray], block: str,
                 sublayer: str = '') -> np.ndarray:
  """The weights of the `block`_{i} layers (or one scanned `block`) stacked: (L, B, N, T, S).

  `sublayer` picks one attention per block by name (e.g. 'CrossAttention').
  """
  paths = [p for p in weights if re.search(rf'(^|/){block}(_\d+)?(/|$)', p) and sublayer in p]
  if not paths:
    raise ValueError(f'No attention weights under {block!r} (sublayer {sublayer!r}); '
                     f'found: {sorted(weights)}.')
  if len(paths) == 1 and _block_number(paths[0], block) < 0:
    return weights[paths[0]]  # A scanned stack: the layer axis comes first already.
  return np.stack([weights[p] for p in sorted(paths, key=lambda p: _block_number(p, block))])


def vit_attention(model, params, images) -> tuple[np.ndarray, np.ndarray]:
  """Logits (B, classes) and the encoder's attention weights (L, B, N, T, T) for `images`.

  Token 0 is the class token (1 the distillation token for DeiT; none with 'gap'),
  then the patches in row-major order.
  """
  logits, weights = collect_attention(model, params, images)
  return np.asarray(logits, np.float32), stack_by_layer(weights, 'encoderblock')


def cross_attention(model, params, inputs, targets) -> np.ndarray:
  """Encoder-decoder attention (L, B, N, T, S) of a seq2seq Transformer, teacher-forced.

  Row t is what the decoder looks at in the source while predicting `targets[:, t]`.
  """
  _, weights = collect_attention(model, params, inputs, targets)
  return stack_by_layer(weights, 'decoderblock', 'CrossAttention')


# ------------------------------------------------------------------------------ maps


def fuse_heads(weights: np.ndarray, head_fusion: str = 'mean') -> np.ndarray:
  """(..., N, T, S) -> (..., T, S) by the mean, max or min over heads (axis -3)."""
  if head_fusion not in HEAD_FUSIONS:
    raise ValueError(f'Unknown head_fusion {head_fusion!r}; choose one of {HEAD_FUSIONS}.')
  return getattr(np, head_fusion)(weights, axis=-3)


def attention_rollout(weights: np.ndarray, head_fusion: str = 'mean',
                      add_residual: bool = True) -> np.ndarray:
  """Attention rollout (Abnar & Zuidema, 2020): how much each output token draws on each input.

  Args:
    weights: (L, B, N, T, T) self-attention weights, layer 0 first.
    head_fusion: how the heads of a layer are combined: 'mean', 'max' or 'min'.
    add_residual: account for the residual connections: each layer's fused attention A
      becomes (A + I) / 2, rows renormalised.

  Returns:
    (B, T, T): A_L' ... A_2' A_1'; row t is output token t's weights over the input tokens.
  """
  weights = np.asarray(weights, np.float64)
  if weights.ndim != 5 or weights.shape[-1] != weights.shape[-2]:
    raise ValueError(f'Expected self-attention weights (layers, batch, heads, T, T), got shape '
                     f'{weights.shape}.')
  layers = fuse_heads(weights, head_fusion)  # (L, B, T, T)
  identity = np.eye(layers.shape[-1])
  if add_residual:
    layers = (layers + identity) / 2
    layers = layers / layers.sum(axis=-1, keepdims=True)
  rollout = np.broadcast_to(identity, layers.shape[1:])
  for layer in layers:
    rollout = layer @ rollout
  return rollout


def _grid_shape(num_patches: int, grid_shape: Sequence[int] | None) -> tuple[int, int]:
  if grid_shape is not None:
    if grid_shape[0] * grid_shape[1] != num_patches:
      raise ValueError(f'grid_shape {tuple(grid_shape)} does not hold the {num_patches} patch '
                       'tokens; pass (image height / patch, image width / patch).')
    return tuple(grid_shape)
  side = int(round(num_patches**0.5))
  if side * side != num_patches:
    raise ValueError(f'{num_patches} patch tokens do not form a square grid; pass grid_shape.')
  return side, side


def _query_rows(attention: np.ndarray, num_prefix_tokens: int) -> np.ndarray:
  """(..., T, S) -> (..., S - prefix) over the patches: the class token's row, or with no
  class token ('gap'), the mean row of all tokens."""
  if num_prefix_tokens:
    return attention[..., 0, num_prefix_tokens:]
  return attention.mean(axis=-2)


def class_token_maps(weights: np.ndarray, layer: int = -1, num_prefix_tokens: int = 1,
                     grid_shape: Sequence[int] | None = None) -> np.ndarray:
  """Per-head attention of the class token over the patch grid: (B, N, rows, cols).

  Args:
    weights: (L, B, N, T, T) from `vit_attention`.
    layer: which layer (negative counts from the last).
    num_prefix_tokens: tokens before the patches (`num_prefix_tokens(model)`); with 0
      ('gap') the map is the mean attention of all tokens.
    grid_shape: (rows, cols) of patches; None: a square grid.
  """
  num_layers = weights.shape[0]
  if not -num_layers <= layer < num_layers:
    raise errors.ConfigError(f'layer={layer} is out of range for a model with {num_layers} layers.')
  rows = _query_rows(weights[layer], num_prefix_tokens)  # (B, N, patches)
  return rows.reshape(*rows.shape[:-1], *_grid_shape(rows.shape[-1], grid_shape))


def rollout_maps(weights: np.ndarray, num_prefix_tokens: int = 1,
                 grid_shape: Sequence[int] | None = None, head_fusion: str = 'mean',
                 add_residual: bool = True) -> np.ndarray:
  """Attention rollout of the class token over the patch grid: (B, rows, cols)."""
  rows = _query_rows(attention_rollout(weights, head_fusion, add_residual), num_prefix_tokens)
  return rows.reshape(rows.shape[0], *_grid_shape(rows.shape[-1], grid_shape))


# ------------------------------------------------------------------------------ plots


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  if not os.environ.get('DISPLAY') and 'inline' not in matplotlib.get_backend():
    matplotlib.use('Agg')  # Headless: write files, never open windows.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _displayable(image: np.ndarray, pixel_mean=0.5, pixel_std=0.5) -> np.ndarray:
  """A model input (H, W, C), normalized as its pixel statistics say, -> [0, 1] (H, W[, C])."""
  scale, offset = normalization.affine(pixel_mean, pixel_std, np.shape(image)[-1], where='')
  image = np.clip(normalization.to_unit_interval(image, scale, offset), 0, 1)
  return image[..., 0] if image.shape[-1] == 1 else image


def _overlay(ax, image: np.ndarray, heat: np.ndarray, title: str, vmax: float,
             cmap: str = 'inferno'):
  """Draws `image` (ready for imshow) with `heat` (rows, cols) over it, half transparent."""
  height, width = image.shape[:2]
  ax.imshow(image, cmap='gray', extent=(0, width, height, 0))
  mappable = ax.imshow(heat, cmap=cmap, alpha=0.6, vmin=0, vmax=vmax,
                       extent=(0, width, height, 0), interpolation='nearest')
  ax.set_title(title, fontsize=9)
  ax.set_xlabel('x (pixels)', fontsize=8)
  ax.set_ylabel('y (pixels)', fontsize=8)
  ax.tick_params(labelsize=7)
  return mappable


def plot_attention_maps(image: np.ndarray, head_maps: np.ndarray,
                        rollout_map: np.ndarray | None = None, layer: int | None = None,
                        title: str = '', pixel_mean=0.5, pixel_std=0.5):
  """The input, each head's class-token attention over it, and the rollout.

  Args:
    image: a model input (H, W, C), normalized with `pixel_mean` and `pixel_std` (the data
      config's; fractions of 255, per channel or one for all; 0.5 and 0.5: inputs in [-1, 1]).
    head_maps: (N, rows, cols) from `class_token_maps`.
    rollout_map: (rows, cols) from `rollout_maps`, or None.
    layer: the layer of `head_maps`, for the titles.
    title: the figure's title (e.g. the prediction).

  Returns:
    A matplotlib Figure; heads share one colour scale, the rollout has its own.
  """
  plt = _pyplot()
  num_heads = head_maps.shape[0]
  panels = 1 + num_heads + (rollout_map is not None)
  columns = min(panels, 6)
  rows = -(-panels // columns)
  figure, axes = plt.subplots(rows, columns, figsize=(2.6 * columns + 1.2, 2.6 * rows),
                              squeeze=False, layout='constrained')
  axes = axes.ravel()
  height, width = image.shape[:2]
  image = _displayable(image, pixel_mean, pixel_std)
  axes[0].imshow(image, cmap='gray', extent=(0, width, height, 0))
  axes[0].set_title('input', fontsize=9)
  axes[0].set_xlabel('x (pixels)', fontsize=8)
  axes[0].set_ylabel('y (pixels)', fontsize=8)
  axes[0].tick_params(labelsize=7)
  layer_name = f'layer {layer}' if layer is not None else 'layer'
  head_max = float(head_maps.max()) or 1.0
  for head in range(num_heads):
    mappable = _overlay(axes[1 + head], image, head_maps[head], f'{layer_name}, head {head}',
                        head_max)
  figure.colorbar(mappable, ax=list(axes[1:1 + num_heads]), shrink=0.8,
                  label='class-token attention')
  if rollout_map is not None:
    rollout_ax = axes[1 + num_heads]
    mappable = _overlay(rollout_ax, image, rollout_map, 'rollout, all layers',
                        float(rollout_map.max()) or 1.0, cmap='viridis')
    figure.colorbar(mappable, ax=rollout_ax, shrink=0.8, label='rollout weight')
  for ax in axes[panels:]:
    ax.axis('off')
  if title:
    figure.suptitle(title)
  return figure


def top_k(logits: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
  """Class ids (B, k), best first, and their softmax probabilities (B, k)."""
  logits = np.asarray(logits, np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ids = np.argsort(-probs, axis=-1)[:, :k]
  return ids, np.take_along_axis(probs, ids, axis=-1)


def plot_predictions(images: np.ndarray, logits: np.ndarray, class_names: Sequence[str] = (),
                     labels: Sequence[int] | None = None, k: int = 5, pixel_mean=0.5,
                     pixel_std=0.5):
  """Each image (model inputs, normalized as `plot_attention_maps` says) beside a bar chart of
  its top-`k` classes and their probabilities."""
  plt = _pyplot()
  ids, probs = top_k(logits, min(k, logits.shape[-1]))
  names = list(class_names) or [str(i) for i in range(logits.shape[-1])]
  figure, axes = plt.subplots(len(images), 2, figsize=(6.5, 2.0 * len(images)), squeeze=False,
                              layout='constrained', gridspec_kw={'width_ratios': [1, 2]})
  for row, image in enumerate(images):
    image_ax, bar_ax = axes[row]
    image_ax.imshow(_displayable(image, pixel_mean, pixel_std), cmap='gray')
    image_ax.set_axis_off()
    if labels is not None:
      image_ax.set_title(f'label: {names[labels[row]]}', fontsize=9)
    bar_ax.barh(range(len(ids[row]))[::-1], probs[row], color='tab:blue')
    bar_ax.set_yticks(range(len(ids[row]))[::-1], [names[i] for i in ids[row]], fontsize=8)
    bar_ax.set_xlim(0, 1)
    bar_ax.set_xlabel('probability', fontsize=8)
  return figure


def plot_cross_attention(weights: np.ndarray, source_tokens: Sequence[str],
                         output_tokens: Sequence[str], title: str = ''):
  """Heat map of (output tokens, source tokens) attention with the tokens on the axes."""
  plt = _pyplot()
  weights = np.asarray(weights)
  if weights.shape != (len(output_tokens), len(source_tokens)):
    raise ValueError(f'weights of shape {weights.shape} do not match {len(output_tokens)} output '
                     f'and {len(source_tokens)} source tokens.')
  figure, ax = plt.subplots(figsize=(1.0 + 0.3 * len(source_tokens),
                                     1.2 + 0.3 * len(output_tokens)), layout='constrained')
  mappable = ax.imshow(weights, cmap='viridis', vmin=0, aspect='auto')
  ax.set_xticks(range(len(source_tokens)), list(source_tokens), fontsize=8, rotation=90)
  ax.set_yticks(range(len(output_tokens)), list(output_tokens), fontsize=8)
  ax.set_xlabel('source tokens (encoder)')
  ax.set_ylabel('output tokens (decoder)')
  figure.colorbar(mappable, ax=ax, label='attention weight')
  if title:
    ax.set_title(title, fontsize=9)
  return figure


def token_labels(tokenizer, ids: Sequence[int], eos_id: int = 1) -> list[str]:
  """One readable label per token id, up to and including EOS ('</s>'); spaces shown as '␣'."""
  labels = []
  for token in ids:
    token = int(token)
    if token == eos_id:
      labels.append('</s>')
      break
    labels.append(tokenizer.decode([token]).replace(' ', '␣') or f'<{token}>')
  return labels


def plot_training_curves(path: str, title: str = ''):
  """Loss (train and test), the test metrics and the learning rate against the step."""
  plt = _pyplot()
  metrics = run_metrics.read_series(path)
  panels: dict[str, list[tuple[str, tuple[np.ndarray, np.ndarray]]]] = {}
  for split in sorted(metrics, key=lambda s: s != 'train'):  # 'train' first.
    for name, points in metrics[split].items():
      if name not in _CURVE_SKIP:
        panels.setdefault(name, []).append((split, points))
  order = sorted(panels, key=lambda n: (n != 'loss', n == 'learning_rate', n))
  figure, axes = plt.subplots(1, len(order), figsize=(3.6 * len(order), 3.0), squeeze=False,
                              layout='constrained')
  for ax, name in zip(axes[0], order):
    for split, (steps, values) in panels[name]:
      ax.plot(steps, values, marker='o' if len(steps) < 20 else None, markersize=3,
              label=split)
    ax.set_xlabel('step')
    ax.set_ylabel(name.replace('_', ' '))
    ax.grid(alpha=0.3)
    if name == 'learning_rate':
      ax.ticklabel_format(axis='y', style='sci', scilimits=(-3, 3))
    ax.legend(fontsize=8)
  if title:
    figure.suptitle(title)
  return figure


def save_figure(figure, path: str, dpi: int = 120) -> str:
  """Writes `figure` as a PNG (creating the directory, replacing `path` only once it is whole),
  closes it and returns `path`."""
  plt = _pyplot()
  try:
    files.write_atomically(path, lambda tmp: figure.savefig(tmp, format='png', dpi=dpi,
                                                            bbox_inches='tight'))
  finally:
    plt.close(figure)
  return path


def num_prefix_tokens(model: Any) -> int:
  """Tokens before the patches in a ViT's sequence (class and distillation tokens)."""
  return len(PREFIX_TOKENS[model.classifier])
