"""Optimisers and learning-rate schedules from the config (optax)."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax import errors, weights

SCHEDULES = ('cosine', 'linear', 'constant', 'rsqrt')
OPTIMIZERS = ('adamw', 'adam', 'sgd')
STATE_DTYPES = ('float32', 'bfloat16')


def default_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = 'adamw'  # 'adamw' (from scratch), 'sgd' (momentum; fine-tuning) or 'adam'.
  config.learning_rate = 1e-3  # Peak learning rate (after warmup).
  config.schedule = 'cosine'  # Decay after warmup: 'cosine', 'linear', 'constant', 'rsqrt'.
  config.warmup_steps = 0  # Linear warmup from 0 to learning_rate.
  config.end_learning_rate = 0.0  # Where 'cosine' and 'linear' decay end.
  config.weight_decay = 0.0  # Decoupled weight decay (adamw), on kernels only.
  config.b1 = 0.9  # Adam beta1.
  config.b2 = 0.999  # Adam beta2.
  config.eps = 1e-8  # Adam epsilon.
  config.momentum = 0.9  # SGD momentum.
  config.nesterov = False  # SGD Nesterov momentum.
  config.grad_clip_norm = 1.0  # Clip gradients by global norm (0 disables).
  config.state_dtype = 'float32'  # First-moment / momentum dtype ('bfloat16' saves memory).
  # Fine-tuning a ViT: each block's learning rate (and weight decay) x layer_decay^(blocks
  # above it + 1); embeddings count as below the first block, the head as above the last. 1: off.
  config.layer_decay = 1.0
  return config


def make_schedule(config: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup, then the configured decay, as a function of the step."""
  if config.schedule not in SCHEDULES:
    raise errors.ConfigError(f'Unknown schedule {config.schedule!r}; choose one of {SCHEDULES}.')
  peak, warmup = config.learning_rate, config.warmup_steps
  if config.schedule == 'rsqrt':
    # The Transformer paper: peak * min(step / warmup, sqrt(warmup / step)).
    warmup = max(warmup, 1)
    return lambda step: peak * jnp.minimum(
        (step + 1) / warmup, jnp.sqrt(warmup / jnp.maximum(step + 1, 1)))
  decay_steps = max(total_steps - warmup, 1)
  decay = {
      'cosine': optax.cosine_decay_schedule(peak, decay_steps,
                                            alpha=config.end_learning_rate / peak if peak else 0),
      'linear': optax.linear_schedule(peak, config.end_learning_rate, decay_steps),
      'constant': optax.constant_schedule(peak),
  }[config.schedule]
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def weight_decay_mask(params):
  """True for kernels (dense, conv); False for biases, norms, embeddings, tokens."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], 'key', None) == 'kernel', params)


_BLOCK = re.compile(r'^Transformer/encoderblock(?:_(\d+))?/')  # encoderblock_N, or scanned.
_ABOVE_BLOCKS = ('Transformer/encoder_norm/', 'pre_logits/', 'head/', 'head_dist/')


def _num_blocks(flat: dict) -> int:
  """Encoder blocks of a ViT's flat params (`encoderblock_N`, or stacked by nn.scan)."""
  indices = [int(m.group(1)) for m in map(_BLOCK.match, flat) if m and m.group(1)]
  stacked = [value.shape[0] for name, value in flat.items()
             if (m := _BLOCK.match(name)) and m.group(1) is None]
  return max(indices) + 1 if indices else (stacked[0] if stacked else 0)


def layer_depths(params) -> dict:
  """{flat name: depth}: 0 below the blocks (embeddings, tokens, ResNet stem), N + 1 for block
  `encoderblock_N`, num_blocks + 1 above them (final norm, pre-logits, heads). A scanned block's
  depth is an array (num_blocks, 1, ...) of 1..num_blocks."""
  flat = weights.flatten_params(params)
  num_blocks = _num_blocks(flat)
  if not num_blocks:
    raise errors.ConfigError('config.optimizer.layer_decay applies to ViT models (parameters '
                             'Transformer/encoderblock_N); this model has none: set it to 1.')
  depths = {}
  for name, value in flat.items():
    match = _BLOCK.match(name)
    if match and match.group(1) is not None:
      depths[name] = int(match.group(1)) + 1
    elif match:
      depths[name] = np.arange(1, num_blocks + 1).reshape((-1,) + (1,) * (len(value.shape) - 1))
    else:
      depths[name] = num_blocks + 1 if name.startswith(_ABOVE_BLOCKS) else 0
  return depths


def layer_scales(params, decay: float) -> dict:
  """{flat name: learning-rate multiplier}: decay^(num_blocks + 1 - depth), 1 for the head."""
  depths = layer_depths(params)
  top = _num_blocks(weights.flatten_params(params)) + 1
  return {name: np.float32(decay) ** (top - depth) for name, depth in depths.items()}


def describe_layer_decay(params, decay: float) -> str:
  """One line: the learning-rate multiplier of each depth."""
  top = _num_blocks(weights.flatten_params(params)) + 1
  names = ['embeddings'] + [f'block {d}' for d in range(1, top)] + ['head']
  parts = [f'{name} x{decay ** (top - depth):.3g}' for depth, name in enumerate(names)]
  return f'Layer-wise learning-rate decay {decay}: ' + ', '.join(parts) + '.'


def scale_by_layer(decay: float) -> optax.GradientTransformation:
  """Multiplies each update by its parameter's `layer_scales` (after the optimizer: so the
  learning rate and the decoupled weight decay are scaled alike, as in BEiT)."""
  def update(updates, state, params=None):
    del params
    scales = layer_scales(updates, decay)

    def scaled(path, update):
      return (update * scales['/'.join(str(key.key) for key in path)]).astype(update.dtype)
    return jax.tree_util.tree_map_with_path(scaled, updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config: ml_collections.ConfigDict,
                   total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optax transformation and its learning-rate schedule."""
  if config.name not in OPTIMIZERS:
    raise errors.ConfigError(f'Unknown optimizer {config.name!r}; choose one of {OPTIMIZERS}.')
  if config.weight_decay and config.name != 'adamw':
    raise errors.ConfigError(
        f'config.optimizer.weight_decay={config.weight_decay} applies to adamw only, but the '
        f"optimizer is {config.name!r}: set --config.optimizer.weight_decay=0, or use "
        '--config.optimizer.name=adamw.')
  if config.state_dtype not in STATE_DTYPES:
    raise errors.ConfigError(f'Unknown config.optimizer.state_dtype={config.state_dtype!r}; '
                             f'choose one of {STATE_DTYPES}.')
  schedule = make_schedule(config, total_steps)
  state_dtype = jnp.dtype(config.state_dtype)
  if config.name == 'sgd':
    tx = optax.sgd(schedule, momentum=config.momentum or None, nesterov=config.nesterov,
                   accumulator_dtype=state_dtype)
  elif config.name == 'adam':
    tx = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps, mu_dtype=state_dtype)
  else:
    tx = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                     mu_dtype=state_dtype, weight_decay=config.weight_decay,
                     mask=weight_decay_mask)
  if not 0 < config.layer_decay <= 1:
    raise errors.ConfigError(f'config.optimizer.layer_decay={config.layer_decay} must be in '
                             '(0, 1] (1: off; 0.65-0.75 is usual for fine-tuning).')
  if config.layer_decay != 1:
    tx = optax.chain(tx, scale_by_layer(config.layer_decay))
  if config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx, schedule
