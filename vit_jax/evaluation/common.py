"""What every extra evaluation shares: the `Evaluator` interface and the batch loop over a mesh."""

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
  def evaluate(self, logits_fn: ImagesFn, features_fn: ImagesFn, mesh,
               batch_size: int) -> dict[str, float]:
    """{metric name: value}, the same on every process; `batch_size` is this process's."""


def global_batches(batches: Iterator[dict[str, np.ndarray]], num_batches: int, mesh,
                   description: str) -> Iterator[dict[str, jax.Array]]:
  """Each process's numpy batches as global arrays split over the mesh, with a progress line."""
  with progress.phase(description, total=num_batches, unit='batches') as phase:
    for batch in batches:
      yield mesh_lib.global_batch(batch, mesh)
      phase.advance()


def summed(sums: Iterator[dict[str, jax.Array]]) -> dict[str, float]:
  """Adds up per-batch sums on the devices; one transfer at the end."""
  totals = None
  for batch_sums in sums:
    totals = batch_sums if totals is None else jax.tree.map(jnp.add, totals, batch_sums)
  return {key: float(value) for key, value in jax.device_get(totals).items()}


def ratio(numerator: float, denominator: float) -> float:
  """numerator / denominator; NaN when nothing was counted."""
  return numerator / denominator if denominator else float('nan')
