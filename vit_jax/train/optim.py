"""Optimisers and learning-rate schedules from the config (optax)."""

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import errors

SCHEDULES = ('cosine', 'linear', 'constant', 'rsqrt')
OPTIMIZERS = ('adamw', 'adam', 'sgd')


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
  if config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx, schedule
