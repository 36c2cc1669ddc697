"""The translation dataset: `build` and one host's packed train and eval batch iterators.

  ds = text.build(config.data, workdir=workdir)  # This host's share; the vocabulary is saved in
                                                 # (or reused from) workdir.
  ds.tokenizer.encode('3 March 1979')  # -> ids without EOS; ds.tokenizer.decode(ids) -> text.
  for batch in ds.train_batches(batch_size=local_batch, seed=config.seed):  # Endless.
    ...  # {'inputs', 'targets': int32 (B, max_length)} and, with config.pack,
         # {'inputs_segmentation', 'targets_segmentation', 'inputs_position', 'targets_position'}.
  for batch in ds.eval_batches(batch_size=local_batch):  # One pass over this host's test share.
    ...  # {'inputs', 'targets': int32 (B, eval_max_length), 'mask': float32 (B,)}.
  ds.eval_texts()  # [(source text, target text)] in eval_batches order.

Token id 0 is padding and id 1 ends every sequence (EOS). Each host holds its share of the data in
memory as token ids, shuffles it each epoch, and packs examples into rows (`packing`). The config
and its defaults are in `text_config`, the vocabulary in `vocabulary`, the sentences' sources in
`text_sources`. Importing this module is cheap; `build` imports TensorFlow.
"""

import itertools
from typing import Iterator

from absl import logging
import ml_collections
import numpy as np

from vit_jax import errors, progress
from vit_jax.data import checks, hosts, packing, text_config, vocabulary


def _check_batch_size(batch_size):
  if not checks.is_int(batch_size) or batch_size < 1:
    raise errors.ConfigError(f'batch_size={batch_size!r} must be an int >= 1.')


class TextDataset:
  """One host's translation data: tokenizer, sizes, and train/eval batch iterators.

  Attributes:
    name: what was loaded ('dates', 'files', or the TFDS name).
    tokenizer: encode(str) -> ids without EOS; decode(ids) -> str; vocab_size.
    num_train_examples: pairs in the whole train split (all hosts), before any filtering.
    num_test_examples: pairs in the whole test split (all hosts), before any filtering.
    local_num_train_examples: this host's train examples in use (empty and skipped ones left out).
    local_num_test_examples: this host's test examples in use.
    num_empty: {'train' | 'test': this host's examples skipped for an empty side}.
    num_long: {'train' | 'test': this host's examples over the length limit (truncated or skipped,
      per config.long_examples)}.
    max_length: train tokens per row and side; eval_max_length: likewise for eval.
  """

  def __init__(self, config: ml_collections.ConfigDict, source, tokenizer, process_index: int,
               process_count: int):
    self.config = config
    self.name = source.name
    self.tokenizer = tokenizer
    self._process_index = process_index
    self._process_count = process_count
    self.max_length = config.max_length
    self.eval_max_length = config.eval_max_length or config.max_length
    with progress.phase(f'Tokenizing {len(source.train.sources):,} train and '
                        f'{len(source.test.sources):,} test pairs'):
      self._train = packing.Examples(source.train, tokenizer, self.max_length,
                                     config.long_examples)
      # Every test pair is evaluated (BLEU over the whole split): long ones are truncated.
      self._test = packing.Examples(
          source.test, tokenizer, self.eval_max_length, 'truncate',
          long_advice='Test pairs are evaluated truncated; raise config.data.eval_max_length to '
          'evaluate them whole.')
    self._max_local_test_examples = source.test.max_local_examples
    self.num_train_examples = source.train.num_examples
    self.num_test_examples = source.test.num_examples
    self.local_num_train_examples = len(self._train)
    self.local_num_test_examples = len(self._test)
    self.num_empty = {'train': self._train.num_empty, 'test': self._test.num_empty}
    self.num_long = {'train': self._train.num_long, 'test': self._test.num_long}

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.vocab_size

  def __repr__(self):
    return (f'TextDataset({self.name!r}, {self.tokenizer!r}, train={self.num_train_examples}, '
            f'test={self.num_test_examples}, max_length={self.max_length}, '
            f'pack={self.config.pack}, host {self._process_index}/{self._process_count})')

  def _epoch_order(self, seed: int, epoch: int) -> np.ndarray:
    """Indices into this host's kept train examples, in the order of `epoch`."""
    num, buffer_size = len(self._train), self.config.shuffle_buffer
    if buffer_size == 1:
      return np.arange(num)
    rng = np.random.default_rng([seed & 0xFFFFFFFF, self._process_index, epoch])
    if buffer_size == 0 or buffer_size >= num:
      return rng.permutation(num)
    return packing.buffer_shuffled(num, buffer_size, rng)

  def _rows(self, seed: int, start_row: int) -> Iterator[np.ndarray]:
    """Endless rows (arrays of kept-example indices), from row `start_row` of the stream.

    Each epoch is packed on its own; skipped epochs are packed (lengths only) but not batched.
    """
    examples = self._train
    for epoch in itertools.count():
      order = self._epoch_order(seed, epoch)
      if self.config.pack:
        bounds = packing.pack(examples.source_lengths[order],
                              examples.target_lengths[order], self.max_length)
      else:
        bounds = np.arange(len(order) + 1)
      num_rows = len(bounds) - 1
      if start_row >= num_rows:
        start_row -= num_rows
        continue
      for row in range(start_row, num_rows):
        yield order[bounds[row]:bounds[row + 1]]
      start_row = 0

  def train_batches(self, batch_size: int, seed: int = 0,
                    start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Endless iterator over this host's shuffled train batches of numpy arrays.

    Yields {'inputs', 'targets': int32 (batch_size, max_length)} (targets end with EOS, 0 is
    padding), and with config.pack also 'inputs_segmentation' / 'targets_segmentation' (1, 2, ...
    per example of a row, 0 on padding) and 'inputs_position' / 'targets_position' (0, 1, ...
    within each example). The same seed (and host) gives the same batches, and `start_step=k`
    gives exactly the batches from batch k on of the stream that start_step=0 gives.
    """
    _check_batch_size(batch_size)
    if start_step < 0:
      raise ValueError(f'start_step={start_step} must be >= 0.')
    if not len(self._train):
      raise errors.ConfigError(
          f'Host {self._process_index} has no train examples left of the {self._train.name} '
          f'({self.num_empty["train"]} empty, {self.num_long["train"]} over max_length='
          f"{self.max_length} with long_examples={self.config.long_examples!r}).")
    rows = self._rows(seed, start_step * batch_size)
    while True:
      yield packing.batch(self._train, list(itertools.islice(rows, batch_size)), self.max_length,
                   self.config.pack)

  def num_eval_batches(self, batch_size: int) -> int:
    """Batches per `eval_batches` pass; the same on every host (some get all-padding batches)."""
    return -(-self._max_local_test_examples // batch_size)

  def eval_batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """One pass over this host's test share, one example per row, padded to whole batches.

    Yields num_eval_batches(batch_size) dicts {'inputs', 'targets': int32 (batch_size,
    eval_max_length), 'mask': float32 (batch_size,)}: mask 1 for real examples, 0 for padding rows
    (all zeros). Across hosts every test example in use appears exactly once with mask 1.
    """
    _check_batch_size(batch_size)
    num_rows = self.num_eval_batches(batch_size) * batch_size
    examples = [np.array([i]) for i in range(len(self._test))]
    rows = examples + [np.zeros(0, np.int64)] * (num_rows - len(examples))
    for start in range(0, num_rows, batch_size):
      batch_rows = rows[start:start + batch_size]
      batch = packing.batch(self._test, batch_rows, self.eval_max_length, packed=False)
      batch['mask'] = np.array([len(r) > 0 for r in batch_rows], np.float32)
      yield batch

  def eval_texts(self) -> list[tuple[str, str]]:
    """(source, target) texts of this host's test examples in use, in eval_batches order.

    The texts are as in the data (not truncated), so targets are the full references.
    """
    return [self._test.texts[i] for i in self._test.kept.tolist()]


def build(config, workdir: str | None = None, process_index: int | None = None,
          process_count: int | None = None) -> TextDataset:
  """Builds the translation pipeline described by `config` for one host.

  Args:
    config: the data ConfigDict (or dict); missing keys take text_config.default_config()'s
      values.
    workdir: where the 'chars' / 'sentencepiece' vocabulary is saved, or reused from when it is
      there already; None: build it and keep it in memory only.
    process_index: this host's index; None: jax.process_index().
    process_count: number of hosts; None: jax.process_count().

  Returns:
    The TextDataset for this host's share of the data.

  Raises:
    ValueError: unknown keys, invalid values, unknown dataset, malformed or misaligned files,
      a saved vocabulary that does not match the config, or no train examples on this host.
    RuntimeError: a TFDS dataset that is not prepared and cannot be prepared here.
  """
  process_index, process_count = hosts.resolve_host(process_index, process_count)
  config = text_config.checked_config(ml_collections.ConfigDict(config))
  from vit_jax.data import text_sources  # pylint: disable=g-import-not-at-top
  source = text_sources.load(config, process_index, process_count)
  tokenizer = vocabulary.build_tokenizer(config, workdir, source)
  dataset = TextDataset(config, source, tokenizer, process_index, process_count)
  if not dataset.local_num_train_examples:
    raise errors.ConfigError(
        f'Host {process_index} of {process_count} has no train examples in use: its share of the '
        f'{source.train.name} has {len(source.train.sources)} examples, '
        f'{dataset.num_empty["train"]} with an empty side and {dataset.num_long["train"]} over '
        f'max_length={config.max_length} (long_examples={config.long_examples!r}).')
  if not dataset.local_num_test_examples and process_count == 1:
    # Every run evaluates at its end: a split with nothing to evaluate stops it now.
    why = (f'each of its {len(source.test.sources)} has an empty side' if source.test.sources
           else 'it is empty')
    raise errors.ConfigError(f'The test split {source.test.name} has no examples in use: {why}; '
                             'give test pairs with both sides.')
  logging.info('%r', dataset)
  return dataset
