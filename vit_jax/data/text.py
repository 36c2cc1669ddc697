"""Translation input pipeline: config, `build`, tokenizers, and packed per-host batch iterators.

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
memory as token ids, shuffles it each epoch, and packs examples into rows greedily and in order
(an example goes into the current row when both its source and target fit, otherwise it starts the
next row; examples are never split). Importing this module is cheap; `build` imports TensorFlow.
"""

import itertools
from typing import Iterator

from absl import logging
import ml_collections
from ml_collections import config_dict
import numpy as np

from vit_jax import errors, files, progress
from vit_jax.data import checks, hosts, tokenizers
from vit_jax.data.tokenizers import EOS_ID, PAD_ID  # Also text.EOS_ID, text.PAD_ID for callers.

LONG_EXAMPLES = ('truncate', 'skip')
_NUM_LINES_LOGGED = 5  # Line numbers named in a warning about skipped examples.


def default_config() -> ml_collections.ConfigDict:
  """Every text data knob with its default; defaults suit the embedded 'dates' task."""
  config = ml_collections.ConfigDict()
  # 'dates' (embedded, generated: written dates in 5 languages -> 'YYYY-MM-DD'), 'files'
  # (train_files / eval_files), or a TFDS translation dataset ('wmt14_translate/de-en', ...).
  config.dataset = 'dates'
  # 'files': 'SRC,TGT', aligned sentence-per-line UTF-8 files (or .gz).
  config.train_files = config_dict.placeholder(str)
  config.eval_files = config_dict.placeholder(str)  # 'files': 'SRC,TGT' of the test set, likewise.
  # TFDS: source feature ('en'); None: the dataset's first language.
  config.source_language = config_dict.placeholder(str)
  # TFDS: target feature ('de'); None: the dataset's second one.
  config.target_language = config_dict.placeholder(str)
  config.train_split = 'train'  # TFDS split ('train', 'train[:10%]'); dates: 'train' or 'test'.
  config.test_split = 'test'  # TFDS: 'test' (wmt14: newstest2014), 'validation'; dates: 'test'.
  # TFDS data_dir; None: TFDS's default ($TFDS_DATA_DIR or ~/...).
  config.tfds_data_dir = config_dict.placeholder(str)
  # Manually downloaded archives; None: TFDS's default.
  config.tfds_manual_dir = config_dict.placeholder(str)
  config.tfds_download = True  # Run download_and_prepare when not prepared (WMT: GBs, hours).
  # Retries of each download, with exponential backoff (so offline, many take minutes to fail).
  config.tfds_download_retries = 10
  # 'chars' (the training text's characters), 'bytes' (UTF-8 bytes, 258 ids, no file) or
  # 'sentencepiece' (unigram model trained on the training text). 'chars' and 'sentencepiece'
  # are saved in the workdir (tokenizer_chars.json, tokenizer.model) and reused from there.
  config.tokenizer = 'chars'
  config.vocab_size = 8000  # sentencepiece: exact vocabulary size; chars: the most it may have.
  config.vocabulary_sample = 100_000  # Train pairs (spread over the split) to build it on.
  config.max_length = 64  # Train tokens per row and side, EOS included.
  # Eval tokens per row and side, EOS included; None: max_length.
  config.eval_max_length = config_dict.placeholder(int)
  config.long_examples = 'truncate'  # Longer examples: 'truncate' (keep the start) or 'skip'.
  config.pack = True  # Pack several train examples per row (adds segmentation and positions).
  config.shuffle_buffer = 0  # 0: reshuffle everything each epoch; 1: keep the order; N: tf-style.
  config.dates_train_size = 40_000  # dates: train examples (each a different date).
  config.dates_test_size = 1_000  # dates: test examples (dates that are never in train).
  config.dates_seed = 0  # dates: fixes both splits (which dates, formats and casings).
  return config


def _checked_config(config) -> ml_collections.ConfigDict:
  """The defaults updated with `config`; unknown keys and out-of-range values raise ConfigError."""
  check = checks.Checks(default_config(), config, 'text data config')
  c = check.config
  check.require(isinstance(c.dataset, str) and c.dataset, 'dataset',
                "'dates', 'files' or a TFDS name")
  check.require(c.tokenizer in tokenizers.TOKENIZERS, 'tokenizer',
                f'one of {tokenizers.TOKENIZERS}')
  check.require_int('vocab_size', 4, 'an int > 3')
  check.require_int('vocabulary_sample', 1)
  check.require_int('max_length', 2, 'an int >= 2 (a token and EOS)')
  check.require(c.eval_max_length is None
                or (checks.is_int(c.eval_max_length) and c.eval_max_length >= 2),
                'eval_max_length', 'None or an int >= 2')
  check.require_int('tfds_download_retries', 0)
  check.require(c.long_examples in LONG_EXAMPLES, 'long_examples', f'one of {LONG_EXAMPLES}')
  check.require(isinstance(c.pack, bool), 'pack', 'True or False')
  check.require_int('shuffle_buffer', 0)
  check.require_int('dates_train_size', 1)
  check.require_int('dates_test_size', 1)
  check.require_int('dates_seed', 0)
  return check.result()


# ------------------------------------------------------------------------------ Tokenizers


def _checked_vocabulary(tokenizer, config: ml_collections.ConfigDict, path: str):
  """Raises when a saved vocabulary does not match config.vocab_size."""
  if tokenizer.kind == 'sentencepiece':
    ok, wanted = tokenizer.vocab_size == config.vocab_size, 'exactly'
  else:
    ok, wanted = tokenizer.vocab_size <= config.vocab_size, 'at most'
  if not ok:
    raise errors.ConfigError(
        f'{path} holds a {tokenizer.vocab_size}-id {tokenizer.kind} vocabulary, but '
        f'config.data.vocab_size={config.vocab_size} asks for {wanted} that many: set '
        f'vocab_size={tokenizer.vocab_size}, or delete the file (or use a new workdir) to build '
        'a new vocabulary.')


def load_tokenizer(config, workdir: str | None) -> tokenizers.Tokenizer:
  """The tokenizer a run with this data config trained and saved in `workdir`.

  Args:
    config: the data ConfigDict (or dict) of the run; only `tokenizer` and `vocab_size` matter.
    workdir: the run's directory; unused for the 'bytes' tokenizer.

  Raises:
    FileNotFoundError: 'chars' or 'sentencepiece' and no saved vocabulary in workdir.
    ValueError: the saved vocabulary does not match config.vocab_size.
  """
  config = _checked_config(ml_collections.ConfigDict(config))
  if config.tokenizer == 'bytes':
    return tokenizers.ByteTokenizer()
  path = tokenizers.vocabulary_path(config.tokenizer, workdir) if workdir else None
  if path is None or not files.exists(path):
    raise errors.MissingFileError(
        f'No {config.tokenizer} tokenizer model in WORKDIR={workdir!r} (expected '
        f'{tokenizers.VOCABULARY_FILES[config.tokenizer]} there): train first (training builds '
        'the vocabulary and saves it in the workdir), or pass the training run\'s workdir.')
  tokenizer = tokenizers.load(config.tokenizer, path)
  _checked_vocabulary(tokenizer, config, path)
  return tokenizer


def _build_tokenizer(config: ml_collections.ConfigDict, workdir: str | None,
                     source) -> tokenizers.Tokenizer:
  """The vocabulary saved in workdir, or a new one from the train split (saved when possible)."""
  if config.tokenizer == 'bytes':
    return tokenizers.ByteTokenizer()
  path = tokenizers.vocabulary_path(config.tokenizer, workdir) if workdir else None
  if path and files.exists(path):
    tokenizer = tokenizers.load(config.tokenizer, path)
    _checked_vocabulary(tokenizer, config, path)
    logging.info('Reusing the %d-id %s vocabulary in %s', tokenizer.vocab_size,
                 config.tokenizer, path)
    return tokenizer
  # Every host builds it from the same sample of the whole train split, so all get the same ids;
  # each writes the (identical) file, which also serves hosts without a shared workdir.
  texts = source.vocabulary_texts(config.vocabulary_sample)
  with progress.phase(f'Building a {config.tokenizer} vocabulary (at most '
                      f'{config.vocab_size:,} ids) from {len(texts):,} sentences') as phase:
    tokenizer = tokenizers.train(config.tokenizer, texts, config.vocab_size)
    phase.result = f'{tokenizer.vocab_size:,} ids'
  if path:
    files.write_bytes_atomically(path, tokenizer.to_bytes())
    logging.info('Built a %d-id %s vocabulary from %d sentences; saved it in %s',
                 tokenizer.vocab_size, config.tokenizer, len(texts), path)
  else:
    logging.warning('Built a %d-id %s vocabulary from %d sentences, but there is no workdir to '
                    'save it in: translating later needs the same vocabulary.',
                    tokenizer.vocab_size, config.tokenizer, len(texts))
  return tokenizer


# ------------------------------------------------------------------------------ Token storage


class _Side:
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


class _Examples:
  """A split's examples kept after dropping empty (and, with 'skip', long) ones.

  `source` and `target` hold the ids of every stored example; `kept` lists the stored examples in
  use, and `source_lengths` / `target_lengths` their lengths in batches (truncated, EOS included).
  """

  def __init__(self, split, tokenizer, max_length: int, long_examples: str):
    self.name = split.name
    self.texts = list(zip(split.sources, split.targets))
    self.source = _Side(tokenizer, split.sources)
    self.target = _Side(tokenizer, split.targets)
    num = len(self.texts)
    empty = np.array([not (s.strip() and t.strip()) for s, t in self.texts], bool).reshape(num)
    longest = np.maximum(self.source.raw_lengths, self.target.raw_lengths) + 1  # EOS included.
    long = ~empty & (longest > max_length)
    self.num_empty = int(empty.sum())
    self.num_long = int(long.sum())
    if self.num_empty:
      logging.warning(
          "Skipped %d of %d examples in this host's share of the %s whose source or target is "
          'empty (e.g. lines %s).', self.num_empty, num, split.name,
          split.line_numbers[empty][:_NUM_LINES_LOGGED].tolist())
    if self.num_long:
      action = 'Truncated' if long_examples == 'truncate' else 'Skipped'
      logging.warning(
          "%s %d of %d examples in this host's share of the %s that are longer than %d tokens "
          '(source or target, EOS included; the longest has %d, e.g. lines %s). '
          "config.data.long_examples ('truncate' or 'skip') chooses what happens to them; "
          'or raise max_length.',
          action, self.num_long, num, split.name, max_length, int(longest[long].max()),
          split.line_numbers[long][:_NUM_LINES_LOGGED].tolist())
    dropped = empty | long if long_examples == 'skip' else empty
    self.kept = np.flatnonzero(~dropped)  # (K,)
    # Lengths in batches, per kept example: at most max_length - 1 tokens, then EOS.
    self.source_lengths = np.minimum(self.source.raw_lengths[self.kept], max_length - 1) + 1
    self.target_lengths = np.minimum(self.target.raw_lengths[self.kept], max_length - 1) + 1

  def __len__(self):
    return len(self.kept)


def _fill(side: _Side, examples: np.ndarray, lengths: np.ndarray, row_of: np.ndarray,
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


def _batch(examples: _Examples, rows: list[np.ndarray], max_length: int,
           packed: bool) -> dict[str, np.ndarray]:
  """Rows of kept-example indices (some may be empty) -> a dict of (len(rows), max_length)."""
  counts = np.array([len(r) for r in rows], np.int64)
  chosen = np.concatenate(rows).astype(np.int64) if counts.sum() else np.zeros(0, np.int64)
  row_of = np.repeat(np.arange(len(rows)), counts)
  segment = np.arange(len(chosen)) - np.repeat(np.cumsum(counts) - counts, counts) + 1
  batch = {}
  for key, side, lengths in (('inputs', examples.source, examples.source_lengths),
                             ('targets', examples.target, examples.target_lengths)):
    filled = _fill(side, examples.kept[chosen], lengths[chosen], row_of, segment, len(rows),
                   max_length)
    batch[key] = filled['tokens']
    if packed:
      batch[key + '_segmentation'] = filled['segmentation']
      batch[key + '_position'] = filled['position']
  return batch


def _pack(source_lengths: np.ndarray, target_lengths: np.ndarray, max_length: int) -> np.ndarray:
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


def _buffer_shuffled(num: int, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
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


def _check_batch_size(batch_size):
  is_int = isinstance(batch_size, (int, np.integer)) and not isinstance(batch_size, bool)
  if not is_int or batch_size < 1:
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
      self._train = _Examples(source.train, tokenizer, self.max_length, config.long_examples)
      self._test = _Examples(source.test, tokenizer, self.eval_max_length, config.long_examples)
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
    return _buffer_shuffled(num, buffer_size, rng)

  def _rows(self, seed: int, start_row: int) -> Iterator[np.ndarray]:
    """Endless rows (arrays of kept-example indices), from row `start_row` of the stream.

    Each epoch is packed on its own; skipped epochs are packed (lengths only) but not batched.
    """
    examples = self._train
    for epoch in itertools.count():
      order = self._epoch_order(seed, epoch)
      if self.config.pack:
        bounds = _pack(examples.source_lengths[order], examples.target_lengths[order],
                       self.max_length)
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
      yield _batch(self._train, list(itertools.islice(rows, batch_size)), self.max_length,
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
      batch = _batch(self._test, batch_rows, self.eval_max_length, packed=False)
      batch['mask'] = np.array([len(r) > 0 for r in batch_rows], np.float32)
      yield batch

  def eval_texts(self) -> list[tuple[str, str]]:
    """(source, target) texts of this host's test examples in use, in eval_batches order.

    The texts are as in the data (not truncated), so targets are the full references.
    """
    return [self._test.texts[i] for i in self._test.kept.tolist()]


def build(config, workdir: str | None = None, process_index: int | None = None,
          process_count: int | None = None) -> TextDataset:
  """Builds the translation pipeline described by `config` (see default_config) for one host.

  Args:
    config: the data ConfigDict (or dict); missing keys take default_config()'s values.
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
  config = _checked_config(ml_collections.ConfigDict(config))
  from vit_jax.data import text_sources  # pylint: disable=g-import-not-at-top
  source = text_sources.load(config, process_index, process_count)
  tokenizer = _build_tokenizer(config, workdir, source)
  dataset = TextDataset(config, source, tokenizer, process_index, process_count)
  if not dataset.local_num_train_examples:
    raise errors.ConfigError(
        f'Host {process_index} of {process_count} has no train examples in use: its share of the '
        f'{source.train.name} has {len(source.train.sources)} examples, '
        f'{dataset.num_empty["train"]} with an empty side and {dataset.num_long["train"]} over '
        f'max_length={config.max_length} (long_examples={config.long_examples!r}).')
  logging.info('%r', dataset)
  return dataset
