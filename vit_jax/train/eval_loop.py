"""Evaluation on the test split (and `config.evals`), of params and of a state's EMA beside them.

Shared by training (each `eval_every` steps) and `trainer=evaluate` (`vit_jax.train.loop`).
"""

from typing import Any, Callable

from vit_jax import errors
from vit_jax.evaluation import common


def evaluate_params(task, params: Any, mesh, eval_sums: Callable,
                    in_flight: int | None = None) -> dict:
  """Runs the eval split once with the jitted `eval_sums` of `task` (a `loop.Task`); one
  transfer at the end, then the task's `extra_eval`.

  At most `in_flight` batches are queued on the devices at once (None: no limit), as the
  train steps are (`loop.steps_in_flight`); the loop is the extra evaluations'
  (`evaluation.common.summed`). A pass that takes long prints how far it is.
  """
  batches = common.global_batches(task.eval_batches(), task.num_eval_batches(), mesh,
                                  'Evaluating')
  totals = common.summed(batches, lambda batch: eval_sums(params, batch), in_flight)
  if not totals:
    raise errors.ConfigError('The test split is empty: there is nothing to evaluate.')
  return {**task.eval_summary(totals), **task.extra_eval(params, mesh, in_flight)}


def evaluate_state(task, state: dict, mesh, eval_sums: Callable,
                   in_flight: int | None = None) -> dict:
  """`evaluate_params` of the state's params and, beside them, of its EMA ('ema_' figures)."""
  results = evaluate_params(task, state['params'], mesh, eval_sums, in_flight)
  if 'ema_params' in state:
    ema = evaluate_params(task, state['ema_params'], mesh, eval_sums, in_flight)
    results.update({f'ema_{key}': value for key, value in ema.items()
                    if key != 'num_examples'})
  return results
