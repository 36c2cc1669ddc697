"""What one benchmark step runs: our models as the flags set them, and the train steps.

A train step is the trainer's `loop.make_train_step` over a loss of the task's kind,
with AdamW from `optim.make_optimizer` (gradient clipping on).
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from vit_jax.train import loop, optim

NUM_CLASSES = 1000
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def model_overrides(args) -> dict:
  """The model fields the flags set (dtype, attention, matmul, depth, scan, remat)."""
  overrides = {'dtype': DTYPES[args.dtype], 'attention_impl': args.attention,
               'matmul': args.matmul}
  if args.num_layers:
    overrides['num_layers'] = args.num_layers
  if args.scan_layers:
    overrides['scan_layers'] = True
  if args.remat:
    overrides['remat'] = True
  return overrides


class ImageTask:
  """The part of `loop.Task` that `make_train_step` uses, for random labelled images."""

  def __init__(self, model):
    self.model = model

  def loss(self, params, batch, rng, frozen):
    del frozen
    logits = self.model.apply({'params': params}, batch['images'], train=True,
                              rngs={'dropout': rng})
    heads = logits if isinstance(logits, tuple) else (logits,)  # DeiT: two heads.
    loss = sum(optax.softmax_cross_entropy_with_integer_labels(
        h.astype(jnp.float32), batch['labels']).mean() for h in heads) / len(heads)
    return loss, {}


class Seq2SeqTask:
  """`make_train_step`'s view of a translation task: masked token cross-entropy."""

  def __init__(self, model):
    self.model = model

  def loss(self, params, batch, rng, frozen):
    del frozen
    logits = self.model.apply({'params': params}, batch['inputs'], batch['targets'],
                              train=True, rngs={'dropout': rng})
    weights = (batch['targets'] > 0).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0), {}


def optimizer(total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW from the trainer's `optim.make_optimizer` (lr 1e-4, weight decay 1e-4), schedule."""
  config = optim.default_config()
  config.name = 'adamw'
  config.weight_decay = 1e-4
  config.learning_rate = 1e-4
  return optim.make_optimizer(config, total_steps)


def make_train_state(params, tx) -> loop.State:
  return {'step': jnp.zeros((), jnp.int32), 'params': params,
          'opt_state': jax.jit(tx.init)(params), 'rng': jax.random.PRNGKey(1)}


def train_step(task: loop.Task, total_steps: int) -> tuple[Callable, Any]:
  """The trainer's step (one batch, no accumulation) of `task`, and its optimizer."""
  tx, schedule = optimizer(total_steps)
  return loop.make_train_step(task, tx, schedule, accum_steps=1), tx


def vit_step(args, model) -> tuple[Callable, Any]:
  """The function one image-model step runs, and its optimizer (None in infer mode)."""
  if args.mode == 'infer':
    return (lambda p, x: model.apply({'params': p}, x)), None
  return train_step(ImageTask(model), total_steps=args.warmup + args.steps + 1)
