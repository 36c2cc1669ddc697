"""Where translation pairs come from: the embedded 'dates' task, parallel text files, and TFDS.

`load` turns `config.dataset` into a `TextSource`: this host's share of the train and test
splits as lists of (untokenized) source and target sentences, the split sizes, and a sample of the
whole train split to build a vocabulary from. Train shares are interleaved (host i of P takes
examples i, i + P, ...; TFDS: `tfds.split_for_jax_process`), so every host sees every part of a
file; test shares are contiguous (`hosts.host_range`) and in split order, so the hosts' shares
concatenated in host order are the test split in order.
"""

import dataclasses
import gzip
import zlib
from typing import Callable

import ml_collections
import numpy as np

from vit_jax import errors, files, progress
from vit_jax.data import dates, hosts, tfds_common

_VOCABULARY_SPREAD = 16  # TFDS: the vocabulary sample is read from this many even sub-splits.


@dataclasses.dataclass(frozen=True)
class Split:
  """This host's share of one split: aligned source and target sentences."""
  name: str  # For messages: 'train split of dates', 'train files (a.de, a.en)', ...
  sources: list[str]
  targets: list[str]
  line_numbers: np.ndarray  # 1-based line / example number in the whole split, per example.
  num_examples: int  # Whole split, all hosts together, before any filtering.
  max_local_examples: int  # Largest share of any host: sets the eval batch count everywhere.


@dataclasses.dataclass(frozen=True)
class TextSource:
  name: str
  train: Split
  test: Split
  # n -> the source and target sentences of up to n train pairs spread over the whole train
  # split: the same on every host, for building a vocabulary.
  vocabulary_texts: Callable[[int], list[str]]


def _interleaved_share(num_examples: int, process_index: int, process_count: int) -> np.ndarray:
  return np.arange(process_index, num_examples, process_count)


def _contiguous_share(num_examples: int, process_index: int, process_count: int) -> np.ndarray:
  return np.arange(*hosts.host_range(num_examples, process_index, process_count))


def _spread(num_examples: int, num_wanted: int) -> np.ndarray:
  """Indices of min(num_wanted, num_examples) examples evenly spread over range(num_examples)."""
  if num_wanted >= num_examples:
    return np.arange(num_examples)
  return np.linspace(0, num_examples - 1, num_wanted).round().astype(np.int64)


def _in_memory_source(name: str, pairs: dict[str, list[tuple[str, str]]], split_names,
                      process_index: int, process_count: int) -> TextSource:
  """A TextSource over whole splits held on every host: {'train' | 'test': [(src, tgt), ...]}."""
  shares = {}
  for key, share_of in (('train', _interleaved_share), ('test', _contiguous_share)):
    split = pairs[key]
    ids = share_of(len(split), process_index, process_count)
    shares[key] = Split(
        name=split_names[key],
        sources=[split[i][0] for i in ids],
        targets=[split[i][1] for i in ids],
        line_numbers=ids + 1,
        num_examples=len(split),
        max_local_examples=-(-len(split) // process_count))

  def vocabulary_texts(num_pairs):
    train = pairs['train']
    return [text for i in _spread(len(train), num_pairs).tolist() for text in train[i]]

  return TextSource(name=name, train=shares['train'], test=shares['test'],
                    vocabulary_texts=vocabulary_texts)


# ------------------------------------------------------------------------------ dates


def load_dates(config: ml_collections.ConfigDict, process_index: int,
               process_count: int) -> TextSource:
  """The generated date-normalisation task (see `dates`); its splits are 'train' and 'test'."""
  for key in ('train_split', 'test_split'):
    if config[key] not in ('train', 'test'):
      raise errors.ConfigError(f"config.data.{key}={config[key]!r}, but the dates dataset only has "
                               "splits 'train' (dates_train_size) and 'test' (dates_test_size).")
  generated = dates.generate(config.dates_train_size, config.dates_test_size, config.dates_seed)
  pairs = {'train': generated[config.train_split], 'test': generated[config.test_split]}
  names = {key: f'{config[key + "_split"]} split of dates' for key in ('train', 'test')}
  return _in_memory_source('dates', pairs, names, process_index, process_count)


# ------------------------------------------------------------------------------ files


def parse_file_pair(value, key: str) -> tuple[str, str]:
  """'SRC,TGT' -> (SRC, TGT); the error names config.data.<key>."""
  parts = value.split(',') if isinstance(value, str) else []
  if len(parts) != 2 or not all(p.strip() for p in parts):
    raise errors.ConfigError(f"config.data.{key}={value!r}: expected 'SOURCE_FILE,TARGET_FILE' "
                             "(two paths of aligned sentence-per-line files, plain or .gz) for "
                             "dataset='files'.")
  return parts[0].strip(), parts[1].strip()


def read_lines(path: str, field: str) -> list[str]:
  """The lines of a UTF-8 text file (plain or .gz), stripped of surrounding whitespace; `field`
  (config.data.train_files, ...) names it in errors."""
  if not files.exists(path):
    raise errors.MissingFileError(f'{field}: file {path!r} does not exist.')
  if files.isdir(path):
    raise errors.ConfigError(f'{field}: {path!r} is a directory; give a text file.')
  data = files.read_bytes(path)
  if path.endswith('.gz') or data[:2] == b'\x1f\x8b':
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
      raise errors.BadFileError(f'{field}: {path!r} is not a valid gzip file ({e}).') from None
  return decode_lines(data, repr(path))


def decode_lines(data: bytes, name: str) -> list[str]:
  """The lines of UTF-8 text, stripped of surrounding whitespace (and a byte order mark);
  `name` says where the bytes came from in errors."""
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError as e:
    line = data.count(b'\n', 0, e.start) + 1
    column = e.start - (data.rfind(b'\n', 0, e.start) + 1) + 1
    raise errors.BadFileError(
        f'{name} line {line}: not valid UTF-8 ({e.reason}: byte '
        f'{data[e.start:e.start + 1]!r} at byte {column} of the line); re-encode the file as '
        'UTF-8, e.g. `iconv -f latin1 -t utf-8`.') from None
  text = text.removeprefix('\ufeff')  # A byte order mark is not part of the first sentence.
  lines = text.split('\n')  # Not splitlines(): it also splits at \x1c, \u2028, ... inside lines.
  if lines and not lines[-1]:
    lines.pop()  # The final newline ends the last line; it does not start another.
  return [line.strip() for line in lines]


def _read_parallel_files(value, key: str) -> tuple[str, list[tuple[str, str]]]:
  source_path, target_path = parse_file_pair(value, key)
  with progress.phase(f'Reading {source_path} and {target_path}') as phase:
    source_lines = read_lines(source_path, f'config.data.{key}')
    target_lines = read_lines(target_path, f'config.data.{key}')
    phase.result = f'{len(source_lines):,} and {len(target_lines):,} lines'

  if len(source_lines) != len(target_lines):
    raise errors.BadFileError(
        f'config.data.{key}: the parallel files have different line counts: {source_path!r} has '
        f'{len(source_lines)} lines and {target_path!r} has {len(target_lines)}; line i of one '
        'must be the translation of line i of the other.')
  return f'{key} ({source_path}, {target_path})', list(zip(source_lines, target_lines))


def load_files(config: ml_collections.ConfigDict, process_index: int,
               process_count: int) -> TextSource:
  """Aligned sentence-per-line files named by config.train_files and config.eval_files."""
  pairs, names = {}, {}
  for split, key in (('train', 'train_files'), ('test', 'eval_files')):
    if not config[key]:
      raise errors.ConfigError(f"config.data.dataset='files' needs config.data.{key}="
                               "'SOURCE_FILE,TARGET_FILE' (aligned sentence-per-line files).")
    names[split], pairs[split] = _read_parallel_files(config[key], key)
  return _in_memory_source('files', pairs, names, process_index, process_count)


# ------------------------------------------------------------------------------ TFDS


def _translation_languages(builder, config: ml_collections.ConfigDict) -> tuple[str, str]:
  """(source feature, target feature), checked against the dataset's features."""
  features = builder.info.features
  available = list(getattr(features, 'languages', None) or features.keys())
  source = config.source_language or available[0]
  target = config.target_language or (available[1] if len(available) > 1 else None)
  for key, language in (('source_language', source), ('target_language', target)):
    if language not in available:
      raise errors.ConfigError(f'config.data.{key}={language!r} is not a feature of TFDS dataset '
                               f'{config.dataset!r}; its languages are {available}.')
  if source == target:
    raise errors.ConfigError(
        f'config.data.source_language and target_language are both {source!r}.')
  return source, target


def _read_pairs(dataset, source: str, target: str,
                phase: progress.Phase | None = None) -> tuple[list[str], list[str]]:
  """A tf.data dataset of {source: string, target: string} -> two lists of str."""
  sources, targets = [], []
  from vit_jax.data.tf_cpu import as_written  # pylint: disable=g-import-not-at-top
  pairs = dataset.map(as_written(lambda example: (example[source], example[target])))
  for batch in pairs.batch(4096).as_numpy_iterator():
    sources.extend(s.decode('utf-8') for s in batch[0])
    targets.extend(t.decode('utf-8') for t in batch[1])
    if phase is not None:
      phase.advance(len(batch[0]))
  return sources, targets


def load_tfds(config: ml_collections.ConfigDict, process_index: int, process_count: int,
              builder) -> TextSource:
  """A TFDS translation dataset; config.source_language / target_language pick the features."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = config.dataset
  split_size = tfds_common.split_size
  tfds_common.prepare(builder, name, config, tfds)
  source, target = _translation_languages(builder, config)

  def host_split(split, index):
    return tfds.split_for_jax_process(split, process_index=index, process_count=process_count)

  shares = {}
  for key in ('train', 'test'):
    split = config[key + '_split']
    sizes = [split_size(builder, host_split(split, i)) for i in range(process_count)]
    first = sum(sizes[:process_index])
    with progress.phase(f'Reading the {split} split of {name} ({source} -> {target})',
                        total=sizes[process_index], unit='pairs') as phase:
      sources, targets = _read_pairs(builder.as_dataset(
          split=host_split(split, process_index), shuffle_files=False), source, target, phase)
    shares[key] = Split(
        name=f'{split} split of {name}',
        sources=sources,
        targets=targets,
        line_numbers=np.arange(first + 1, first + len(sources) + 1),
        num_examples=split_size(builder, split),
        max_local_examples=max(sizes))

  def vocabulary_texts(num_pairs):
    if num_pairs >= shares['train'].num_examples:
      parts = [config.train_split]
    else:  # The first examples of even parts (each non-empty), not just the split's start.
      parts = tfds.even_splits(config.train_split, n=min(_VOCABULARY_SPREAD, num_pairs))
    texts = []
    for part in parts:
      records = builder.as_dataset(split=part, shuffle_files=False)
      part_sources, part_targets = _read_pairs(records.take(-(-num_pairs // len(parts))),
                                               source, target)
      texts.extend(text for pair in zip(part_sources, part_targets) for text in pair)
    return texts[:2 * num_pairs]

  return TextSource(name=name, train=shares['train'], test=shares['test'],
                    vocabulary_texts=vocabulary_texts)


# ------------------------------------------------------------------------------ Dispatch


def _unknown_dataset_error(config: ml_collections.ConfigDict,
                           error: Exception) -> errors.ConfigError:
  name = config.dataset
  suggestion = tfds_common.suggestion(name)
  return errors.ConfigError(
      f"Unknown dataset {name!r} (config.data.dataset): it is not 'dates' or 'files', and it is "
      'neither a registered TFDS builder nor a dataset prepared in '
      f'tfds_data_dir={config.tfds_data_dir!r} ({type(error).__name__}).{suggestion}')


def load(config: ml_collections.ConfigDict, process_index: int, process_count: int
         ) -> TextSource:
  """'dates', 'files', or a TFDS translation dataset by name."""
  if config.dataset == 'dates':
    return load_dates(config, process_index, process_count)
  if config.dataset == 'files':
    return load_files(config, process_index, process_count)
  # TFDS (and TensorFlow) load only here: the other sources run without them.
  builder = tfds_common.find_builder(config.dataset, config.tfds_data_dir,
                                       lambda error: _unknown_dataset_error(config, error))
  return load_tfds(config, process_index, process_count, builder)
