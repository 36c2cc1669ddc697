"""An exponential moving average (EMA) of the weights, updated after each optimizer step.

ema <- d_t ema + (1 - d_t) params, with d_t = min(decay, (1 + t) / (10 + t)) at update t (1, 2,
...) when warming up (as TensorFlow's ExponentialMovingAverage does with num_updates), so that
the average is not dominated by the initial weights in the first few thousand steps; else
d_t = decay. The average starts as the initial (or pretrained) weights.
"""

import jax
import jax.numpy as jnp


def decay_at(step: jax.Array, decay: float, warmup: bool) -> jax.Array:
  """The decay of update `step` (1 for the first update)."""
  if not warmup:
    return jnp.float32(decay)
  step = jnp.asarray(step, jnp.float32)
  return jnp.minimum(jnp.float32(decay), (1 + step) / (10 + step))


def update(ema_params, params, step: jax.Array, decay: float, warmup: bool):
  """The average after update `step`, whose result is `params`."""
  d = decay_at(step, decay, warmup)
  return jax.tree.map(lambda average, new: (d * average + (1 - d) * new).astype(average.dtype),
                      ema_params, params)
