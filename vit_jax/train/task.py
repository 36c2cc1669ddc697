"""What the training tasks share: this process's batches of their data.

A task (`vit_jax.train.loop.Task`) built on `BatchedTask` gets `train_batches`, `eval_batches`
and `num_eval_batches` from its `data` (an images or text dataset), with `config.batch_size` and
`config.eval_batch_size` split evenly over the processes.
"""

from typing import Iterable, Iterator

import jax
import jax.numpy as jnp
import ml_collections


class BatchedTask:
  """A task's config and data, and this process's share of the global batch sizes."""

  def __init__(self, config: ml_collections.ConfigDict, data):
    self.config = config
    self.data = data
    process_count = jax.process_count()
    self.local_batch_size = config.batch_size // process_count
    self.local_eval_batch_size = config.eval_batch_size // process_count

  def loss_weight(self, batch: dict) -> jax.Array:
    """A microbatch counts by its examples in an accumulated step."""
    return jnp.float32(jax.tree.leaves(batch)[0].shape[0])

  def train_batches(self, start_step: int) -> Iterator[dict]:
    return self.data.train_batches(self.local_batch_size, seed=self.config.seed,
                                   start_step=start_step)

  def eval_batches(self) -> Iterable[dict]:
    return self.data.eval_batches(self.local_eval_batch_size)

  def num_eval_batches(self) -> int:
    return self.data.num_eval_batches(self.local_eval_batch_size)
