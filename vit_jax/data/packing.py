"""Token storage and packing: a split's examples as token ids, laid out in rows and batches.

  examples = packing.Examples(split, tokenizer, max_length, long_examples)  # Tokenized, filtered.
  bounds = packing.pack(examples.source_lengths, examples.target_lengths, max_length)
  batch = packing.batch(examples, rows, max_length, packed=True)  # rows: kept-example indices.

Rows are packed greedily and in order: an example goes into the current row when both its source
and target fit, otherwise it starts the next row; examples are never split.
"""

import jax
import numpy as np

from vit_jax import progress
from vit_jax.data.tokenizers import EOS_ID, PAD_ID

_NUM_LINES_NAMED = 5  # Line numbers named in a line about skipped examples.


def _lines(numbers: np.ndarray) -> str:
  """'line 5', or 'e.g. lines 1, 3, 4, 6, 8'."""
  if len(numbers) == 1:
    return f'line {numbers[0]}'
  shown = ', '.join(str(n) for n in numbers[:_NUM_LINES_NAMED])
  return f'{"e.g. " * (len(numbers) > _NUM_LINES_NAMED)}lines {shown}'


class Side:
  """Token ids of one side (sources or targets) of a split's examples, EOS not stored.

  Attributes:
    ids: int32 (total + 1,): every example's ids concatenated, then one spare 0.
    starts: int64 (N,): where each example's ids start in `ids`.
    raw_lengths: int64 (N,): tokens per example, without EOS, before truncation.
  """

  def __init__(self, tokenizer, texts):
    ids, self.raw_lengths = tokenizer.encode_many(texts)
    self.ids = np.append(ids, np.int32(PAD_ID)).astype(np.int32)
    self.starts = np.cumsum(self.raw_lengths) - self.raw_lengths


class Examples:
  """A split's examples kept after dropping empty (and, with 'skip', long) ones.

  `source` and `target` hold the ids of every stored example; `kept` lists the stored examples in
  use, and `source_lengths` / `target_lengths` their lengths in batches (truncated, EOS included).
  """

  def __init__(self, split, tokenizer, max_length: int, long_examples: str,
               long_advice: str = "config.data.long_examples ('truncate' or 'skip') chooses what "
               'happens to them; or raise config.data.max_length.'):
    self.name = split.name
    self.texts = list(zip(split.sources, split.targets))
    self.source = Side(tokenizer, split.sources)
    self.target = Side(tokenizer, split.targets)
    num = len(self.texts)
    empty = np.array([not (s.strip() and t.strip()) for s, t in self.texts], bool).reshape(num)
    longest = np.maximum(self.source.raw_lengths, self.target.raw_lengths) + 1  # EOS included.
    long = ~empty & (longest > max_length)
    self.num_empty = int(empty.sum())
    self.num_long = int(long.sum())
    # Each process tokenizes its own share of the split, and says what it dropped or cut.
    where = (f"process {jax.process_index()}'s share of the {split.name}"
             if jax.process_count() > 1 else f'the {split.name}')
    if self.num_empty:
      progress.log_on_every_process(
          f'Skipped {self.num_empty} of {num} examples of {where} whose source or target is '
          f'empty ({_lines(split.line_numbers[empty])}).')
    if self.num_long:
      action = 'Truncated' if long_examples == 'truncate' else 'Skipped'
      progress.log_on_every_process(
          f'{action} {self.num_long} of {num} examples of {where} that are longer than '
          f'{max_length} tokens (source or target, EOS included; the longest has '
          f'{int(longest[long].max())}; {_lines(split.line_numbers[long])}). {long_advice}')
    dropped = empty | long if long_examples == 'skip' else empty
    self.kept = np.flatnonzero(~dropped)  # (K,)
    # Lengths in batches, per kept example: at most max_length - 1 tokens, then EOS.
    self.source_lengths = np.minimum(self.source.raw_lengths[self.kept], max_length - 1) + 1
    self.target_lengths = np.minimum(self.target.raw_lengths[self.kept], max_length - 1) + 1

  def __len__(self):
    return len(self.kept)


def _fill(side: Side, examples: np.ndarray, lengths: np.ndarray, row_of: np.ndarray,
          segment: np.ndarray, batch_size: int, max_length: int) -> dict[str, np.ndarray]:
  """Writes examples (stored ids) into rows, each after the previous ones of its row.

  Args:
    side: where the ids come from.
    examples: int (n,) stored example ids, grouped by row, in row order.
    lengths: int (n,) tokens each takes, EOS included.
    row_of: int (n,) the row of each example.
    segment: int (n,) 1, 2, ... within each row.
    batch_size: rows.
    max_length: tokens per row.

  Returns:
    {'tokens', 'segmentation', 'position'}: int32 (batch_size, max_length), 0 on padding.
  """
  ends = np.cumsum(lengths)
  starts = ends - lengths  # Where each example starts in all examples' tokens concatenated.
  first_of_row = np.arange(len(examples)) - (segment - 1)  # Its row's first example, per example.
  column = starts - starts[first_of_row]  # Where each example starts in its row.
  position = np.arange(ends[-1] if len(ends) else 0) - np.repeat(starts, lengths)  # (T,)
  from_ids = np.minimum(np.repeat(side.starts[examples], lengths) + position, len(side.ids) - 1)
  is_eos = position == np.repeat(lengths - 1, lengths)
  rows, columns = np.repeat(row_of, lengths), np.repeat(column, lengths) + position
  arrays = {key: np.zeros((batch_size, max_length), np.int32)
            for key in ('tokens', 'segmentation', 'position')}
  arrays['tokens'][rows, columns] = np.where(is_eos, EOS_ID, side.ids[from_ids])
  arrays['segmentation'][rows, columns] = np.repeat(segment, lengths)
  arrays['position'][rows, columns] = position
  return arrays


def batch(examples: Examples, rows: list[np.ndarray], max_length: int,
          packed: bool) -> dict[str, np.ndarray]:
  """Rows of kept-example indices (some may be empty) -> a dict of (len(rows), max_length)."""
  counts = np.array([len(r) for r in rows], np.int64)
  chosen = np.concatenate(rows).astype(np.int64) if counts.sum() else np.zeros(0, np.int64)
  row_of = np.repeat(np.arange(len(rows)), counts)
  segment = np.arange(len(chosen)) - np.repeat(np.cumsum(counts) - counts, counts) + 1
  arrays = {}
  for key, side, lengths in (('inputs', examples.source, examples.source_lengths),
                             ('targets', examples.target, examples.target_lengths)):
    filled = _fill(side, examples.kept[chosen], lengths[chosen], row_of, segment, len(rows),
                   max_length)
    arrays[key] = filled['tokens']
    if packed:
      arrays[key + '_segmentation'] = filled['segmentation']
      arrays[key + '_position'] = filled['position']
  return arrays


def pack(source_lengths: np.ndarray, target_lengths: np.ndarray, max_length: int) -> np.ndarray:
  """Row boundaries (R + 1,) of greedy in-order packing: row r holds examples [b[r], b[r+1])."""
  bounds = [0]
  used_source = used_target = 0
  for index, (source, target) in enumerate(zip(source_lengths.tolist(),
                                               target_lengths.tolist())):
    if used_source + source > max_length or used_target + target > max_length:
      bounds.append(index)
      used_source = used_target = 0
    used_source += source
    used_target += target
  bounds.append(len(source_lengths))
  return np.array(bounds if len(source_lengths) else [0], np.int64)


def buffer_shuffled(num: int, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
  """range(num) through a shuffle buffer of buffer_size, as tf.data.Dataset.shuffle does it."""
  buffer = list(range(min(buffer_size, num)))
  upcoming = len(buffer)
  order = []
  for draw in rng.random(num).tolist():
    slot = int(draw * len(buffer))
    order.append(buffer[slot])
    if upcoming < num:
      buffer[slot] = upcoming
      upcoming += 1
    else:
      buffer[slot] = buffer[-1]
      buffer.pop()
  return np.array(order, np.int64)
