"""A diverging run: the first step whose loss is NaN or infinite stops it, in one line."""

import ml_collections
import numpy as np

from vit_jax import errors


class TrainingDiverged(errors.UserError, RuntimeError):
  """The loss became NaN or infinite; the message names the settings to change."""


def check(pending: list[tuple[int, dict]], optimizer: ml_collections.ConfigDict, checkpointer):
  """Raises TrainingDiverged at the first of `pending`'s (step, metrics) with a loss that is not
  finite, naming the last checkpoint (its save completed first) and `optimizer`'s settings."""
  bad = next(((step, m['loss']) for step, m in pending if not np.isfinite(m['loss'])), None)
  if bad is None:
    return
  checkpointer.finish()
  last_good = checkpointer.latest_step()
  change = (f'Lower --config.optimizer.learning_rate (now {optimizer.learning_rate:g}), or clip '
            'gradients harder with --config.optimizer.grad_clip_norm (now '
            f'{optimizer.grad_clip_norm:g}; 0 is off)')
  resume = (f'The last checkpoint with finite weights is step {last_good} in '
            f'{checkpointer.directory}. {change}, then rerun to resume from it (or use a new '
            '--workdir if its loss was already far off).' if last_good is not None else
            f'No checkpoint was written yet. {change}, then rerun to start again from step 0.')
  raise TrainingDiverged(f'The loss became {bad[1]} at step {bad[0]}; training stopped. {resume}')
