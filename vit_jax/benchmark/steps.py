"""What one benchmark step runs: our models as the flags set them, and the trainer's steps.

A train step is the trainer's own: `loop.make_train_step` over the loss of the task
(`ClassificationTask.loss`, `TranslationTask.loss`), with AdamW from
`optim.make_optimizer` (gradient clipping on).
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.train import classification, loop, optim, translation

NUM_CLASSES = 1000
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def model_overrides(args) -> dict:
  """The model fields the flags set (dtype, attention, shape, scan, remat)."""
  overrides = {'dtype': DTYPES[args.dtype], 'attention_impl': args.attention}
  for name in ('num_layers', 'embed_dim', 'mlp_dim', 'num_heads'):
    if getattr(args, name, None):
      overrides[name] = getattr(args, name)
  if args.scan_layers:
    overrides['scan_layers'] = True
  if args.remat:
    overrides['remat'] = True
  return overrides


def _task_config() -> ml_collections.ConfigDict:
  """The config fields the tasks' losses read: no label smoothing."""
  return ml_collections.ConfigDict({'label_smoothing': 0.0})


class ImageTask(classification.ClassificationTask):
  """The trainer's classification task without its data or teacher, for its loss.

  Batches are the trainer's: {'image': (B, H, W, 3), 'label': (B,)}.
  """

  def __init__(self, model):  # pylint: disable=super-init-not-called
    self.model = model
    self.config = _task_config()
    self.distilled = model.classifier == 'token_distill'
    self.teacher = None


class Seq2SeqTask(translation.TranslationTask):
  """The trainer's translation task without its data, for its loss.

  Batches are the trainer's, unpacked: {'inputs': (B, S), 'targets': (B, T)}.
  """

  def __init__(self, model):  # pylint: disable=super-init-not-called
    self.model = model
    self.config = _task_config()


def optimizer(total_steps: int, state_dtype: str = 'float32'
              ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW from the trainer's `optim.make_optimizer` (lr 1e-4, weight decay 1e-4), schedule;
  `state_dtype` is the first moment's."""
  config = optim.default_config()
  config.state_dtype = state_dtype
  config.name = 'adamw'
  config.weight_decay = 1e-4
  config.learning_rate = 1e-4
  return optim.make_optimizer(config, total_steps)


def make_train_state(params, tx) -> loop.State:
  return {'step': jnp.zeros((), jnp.int32), 'params': params,
          'opt_state': jax.jit(tx.init)(params), 'rng': jax.random.PRNGKey(1)}


def train_step(task: loop.Task, total_steps: int,
               state_dtype: str = 'float32') -> tuple[Callable, Any]:
  """The trainer's step (one batch, no accumulation) of `task`, and its optimizer."""
  tx, schedule = optimizer(total_steps, state_dtype)
  return loop.make_train_step(task, tx, schedule, accum_steps=1), tx


def vit_step(args, model) -> tuple[Callable, Any]:
  """The function one image-model step runs, and its optimizer (None in infer mode)."""
  if args.mode == 'infer':
    return (lambda p, x: model.apply({'params': p}, x)), None
  return train_step(ImageTask(model), total_steps=args.warmup + args.steps + 1,
                    state_dtype=args.optimizer_state_dtype)
