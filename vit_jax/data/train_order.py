"""Which record each train example is, computed from its position in the stream.

Position p of a host's train stream (p = step * batch_size + row) is record
`record_index(p)`: epoch p // n of the n records, each epoch a fresh stateless permutation
(`tf.random.experimental.index_shuffle`). A run resumed at step N therefore starts at position
N * batch_size without reading, let alone decoding, anything before it. With repeated
augmentation (`repeats` r > 1), positions r*k to r*k + r - 1 are all draw k of that order: r
copies of one record in a row, each augmented with its own position's seed.

Records that fail to decode (a truncated JPEG in an image folder) keep their position: the
example is marked failed, and `fill_failed_rows` gives its row of the batch to another image of
the same batch, so a folder with bad files yields the same batches whether or not the run stopped.
"""

import sys

from vit_jax import errors
from vit_jax.data.tf_cpu import as_written, tf

_NO_END = 2**62  # Positions of an endless stream.


def record_index(position, num_records: int, shuffle_seed: int | None, repeats: int = 1):
  """The record at each int64 `position` (a scalar or a vector): each epoch a permutation of
  0..num_records-1, each record `repeats` times in a row; `shuffle_seed` None keeps the order."""
  draw = position // repeats
  epoch, offset = draw // num_records, draw % num_records
  if shuffle_seed is None:
    return offset
  # (..., 3) seeds, one per position: the epoch's permutation. The raw op, because the
  # `index_shuffle` wrapper pads a (n, 2) seed along n.
  seed = tf.stack([tf.fill(tf.shape(epoch), tf.constant(shuffle_seed, tf.int64)), epoch,
                   tf.zeros_like(epoch)], -1)
  last = tf.fill(tf.shape(offset), tf.constant(num_records - 1, tf.int64))
  return tf.raw_ops.RandomIndexShuffle(index=offset, seed=seed, max_index=last, rounds=4)


def _check_records(num_records: int):
  if num_records < 1:
    raise errors.ConfigError('This host has no train examples: the train split has fewer '
                             'examples than there are processes.')


def positions(start: int, num_records: int, shuffle_seed: int | None, repeats: int = 1):
  """Endless dataset of (position, record index) from position `start` on."""
  _check_records(num_records)
  return tf.data.Dataset.range(start, _NO_END).map(
      as_written(lambda p: (p, record_index(p, num_records, shuffle_seed, repeats))))


def position_batches(start: int, batch_size: int, num_records: int, shuffle_seed: int | None,
                     repeats: int = 1):
  """Like `positions`, batched: (positions (batch_size,), record indices (batch_size,))."""
  _check_records(num_records)
  return tf.data.Dataset.range(start, _NO_END).batch(batch_size).map(
      as_written(lambda p: (p, record_index(p, num_records, shuffle_seed, repeats))))


def failsafe_map(dataset, prepare, failed_example: dict, start: int, warning=None,
                 end: int | None = None):
  """`dataset.map(prepare)` where an element whose `prepare` raises becomes `failed_example`.

  `dataset` holds (position, record) with consecutive positions from `start`; `prepare` maps
  them to (position, example), traced as given (callers pass it `as_written`). Failed elements
  are dropped, then their positions refilled with (position, failed_example), so the order and
  positions stay those of `dataset`. `warning` (position -> tf.string) is the line printed on
  stderr for each failed element. `end`: the position after the last of a finite `dataset`,
  so that failures at its end are filled too.
  """
  prepared = dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  prepared = prepared.ignore_errors(log_warning=True)
  if end is not None:  # A last element at `end`, dropped below: the gap before it is filled.
    prepared = prepared.concatenate(tf.data.Dataset.from_tensors(
        (tf.constant(end, tf.int64), failed_example)))

  @as_written
  def previous_position(last, element):
    position, example = element
    return position, (last, position, example)

  @as_written
  def said(position):
    if warning is None:
      return position
    with tf.control_dependencies([tf.print(warning(position), output_stream=sys.stderr)]):
      return tf.identity(position)

  @as_written
  def with_gaps_filled(last, position, example):
    gap = tf.data.Dataset.zip((tf.data.Dataset.range(last + 1, position).map(said),
                               tf.data.Dataset.from_tensors(failed_example).repeat()))
    return gap.concatenate(tf.data.Dataset.from_tensors((position, example)))

  filled = prepared.scan(tf.constant(start - 1, tf.int64), previous_position).flat_map(
      with_gaps_filled)
  return filled if end is None else filled.take(end - start)


def undecodable(name, consequence: str):
  """The warning line of a record `name` (tf.string) that could not be decoded."""
  return tf.strings.join(['warning: ', name, ' could not be decoded (TensorFlow says why above); ',
                          consequence])


def fill_failed_rows(batch):
  """Drops 'ok' from a batch, giving each failed row the content of an ok row (round robin)."""
  ok = batch.pop('ok')
  ok_rows = tf.cast(tf.where(ok)[:, 0], tf.int32)
  num_ok = tf.size(ok_rows)
  tf.debugging.assert_positive(num_ok, message='No image of a train batch could be decoded.')
  failed_rank = tf.cumsum(tf.cast(tf.logical_not(ok), tf.int32)) - 1
  donors = tf.gather(ok_rows, tf.maximum(failed_rank, 0) % num_ok)  # An ok row per failed one.
  rows = tf.where(ok, tf.range(tf.size(ok)), donors)
  return {key: tf.gather(value, rows) for key, value in batch.items()}
