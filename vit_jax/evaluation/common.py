"""What every extra evaluation shares: the `Evaluator` interface and the batch loop over a mesh
(which the test split's evaluation, `train.eval_loop`, runs too)."""

import abc
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import progress
from vit_jax.train import mesh as mesh_lib

# images (a global device batch) -> float32 (B, 1000) logits, or (B, D) pre-logits features.
ImagesFn = Callable[[jax.Array], jax.Array]


class Evaluator(abc.ABC):
  """One extra evaluation: a dataset, what is measured on it, and the names of its figures."""

  name: str  # The evaluation's name in `EVALS`.
  metric_names: tuple[str, ...]  # The keys of what `evaluate` returns.

  @abc.abstractmethod
  def evaluate(self, logits_fn: ImagesFn, features_fn: ImagesFn, mesh, batch_size: int,
               in_flight: int | None = None) -> dict[str, float]:
    """{metric name: value}, the same on every process; `batch_size` is this process's; at
    most `in_flight` batches queued on the devices at once (None: the evaluator's own limit,
    if any)."""


def global_batches(batches: Iterator[dict[str, np.ndarray]], num_batches: int, mesh,
                   description: str) -> Iterator[dict[str, jax.Array]]:
  """Each process's numpy batches as global arrays split over the mesh, with a progress line."""
  with progress.phase(description, total=num_batches, unit='batches') as phase:
    for batch in batches:
      yield mesh_lib.global_batch(batch, mesh)
      phase.advance()


def summed(batches: Iterator[dict[str, jax.Array]],
           batch_sums: Callable[[dict[str, jax.Array]], dict[str, jax.Array]],
           in_flight: int | None = None) -> dict[str, float]:
  """Adds up `batch_sums(batch)` of each batch on the devices; one transfer at the end; {}
  when there is no batch.

  At most `in_flight` batches are queued on the devices at once (None: no limit): the test
  split's evaluation passes `loop.steps_in_flight`, as the extra evaluations do.
  """
  totals = None
  queued = []  # Each batch's sums.
  for batch in batches:
    if in_flight and len(queued) >= in_flight:  # The batch in_flight back has finished.
      jax.block_until_ready(queued[-in_flight])
    sums = batch_sums(batch)
    queued.append(sums)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    return {}
  return {key: float(value) for key, value in jax.device_get(totals).items()}


def ratio(numerator: float, denominator: float) -> float:
  """numerator / denominator; NaN when nothing was counted."""
  return numerator / denominator if denominator else float('nan')
