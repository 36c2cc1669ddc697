"""Where images come from: the embedded digits set, TFDS datasets, and image folders.

`load` turns `config.dataset` into a `Source`: this host's share of the train and test splits as
small records (arrays, encoded bytes or file paths), a `decode` function that turns a record into
{'image': uint8 (H, W, C), 'label': int32 ()}, and the split sizes. Train records are read by
index (`read_train`), so that a resumed run starts reading where it stopped; only TFDS datasets
stored as tfrecord files, which have no index, are read as a stream (`train`).
Each split is divided among hosts like `tfds.even_splits` does it: with N examples and P hosts,
every host gets N // P and the first N % P hosts one more.
"""

import concurrent.futures
import dataclasses
import os
from typing import Any, Callable

from absl import logging
import ml_collections
import numpy as np

from vit_jax import errors, files, progress
from vit_jax.data import digits, tfds_common
from vit_jax.data.hosts import host_range
from vit_jax.data.tf_cpu import as_written, tf

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_JPEG_SIGNATURE = b'\xff\xd8\xff'
_FOLDER_LAYOUT = 'DIR/{train,test}/<class name>/*.{jpg,jpeg,png}'


@dataclasses.dataclass(frozen=True)
class Source:
  """One host's share of a labelled image dataset, before decoding and preprocessing."""
  name: str
  num_classes: int
  num_train_examples: int  # Whole train split, all hosts together.
  num_test_examples: int  # Whole test split, all hosts together.
  local_num_test_examples: int  # This host's share of the test split.
  max_local_test_examples: int  # Largest share of any host: sets the eval batch count everywhere.
  local_num_train_examples: int  # This host's share of the train split.
  # int64 index in 0..local_num_train_examples-1 -> this host's train record (tf ops).
  read_train: Callable[[Any], dict] | None
  # shuffle_seed -> tf.data.Dataset of this host's train records; only where read_train is None.
  train: Callable[[int], Any] | None
  test: Callable[[], Any]  # () -> tf.data.Dataset of this host's test records, in a fixed order.
  # record -> {'image': uint8 (H, W, C), 'label': int32 ()}; None: records are that already.
  decode: Callable[[Any], dict] | None
  # record -> its image file's bytes (JPEG, PNG, ...), for decoders that crop as they decode;
  # None: records hold no encoded image.
  encoded: Callable[[Any], Any] | None = None
  # True (image folders): records may fail to decode; eval drops them, and in training another
  # image of the same batch takes the place of one.
  decode_can_fail: bool = False
  # (split 'train' or 'test', int64 index in this host's share) -> tf.string naming that
  # record in warnings (an image file's path); None: records are unnamed.
  record_name: Callable[[str, Any], Any] | None = None
  skipped_files: tuple[str, ...] = ()  # Files left out at load time (image folders).
  class_names: tuple[str, ...] = ()  # Name of each label id; () when the dataset has none.


def _in_memory_source(name: str, class_names: tuple[str, ...],
                      splits: dict[str, tuple[np.ndarray, np.ndarray]],
                      process_index: int, process_count: int) -> Source:
  """A Source over {'train' | 'test': (uint8 images (N, H, W, C), int labels (N,))} arrays."""
  shares = {}
  for split, (images, labels) in splits.items():
    start, stop = host_range(len(labels), process_index, process_count)
    shares[split] = {'image': images[start:stop], 'label': labels[start:stop].astype(np.int32)}

  train_columns = {key: tf.constant(value) for key, value in shares['train'].items()}

  def read_train(index):
    return {key: tf.gather(column, index) for key, column in train_columns.items()}

  def test():
    return tf.data.Dataset.from_tensor_slices(shares['test'])

  num_test = len(splits['test'][1])
  return Source(
      name=name,
      num_classes=len(class_names),
      num_train_examples=len(splits['train'][1]),
      num_test_examples=num_test,
      local_num_train_examples=len(shares['train']['label']),
      local_num_test_examples=len(shares['test']['label']),
      max_local_test_examples=-(-num_test // process_count),
      read_train=read_train,
      train=None,
      test=test,
      decode=None,
      class_names=class_names)


def digits_splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """sklearn's 8x8 digits, split 1437 train / 360 test by a fixed permutation (seed 0).

  Returns:
    {'train' | 'test': (uint8 images (N, 8, 8, 1) with 0..16 scaled to 0..255, int64 labels (N,))}.
  """
  return {split: (images[..., None], labels)  # (N, 8, 8, 1)
          for split, (images, labels) in digits.splits(seed=0).items()}


def load_digits(config: ml_collections.ConfigDict, process_index: int,
                process_count: int) -> Source:
  """The embedded digits dataset (no download); splits are named 'train' and 'test'."""
  arrays = digits_splits()
  for key in ('train_split', 'test_split'):
    if config[key] not in arrays:
      raise errors.ConfigError(f"config.{key}={config[key]!r}, but the digits dataset only has "
                               "splits 'train' (1437 images) and 'test' (360 images).")
  splits = {'train': arrays[config.train_split], 'test': arrays[config.test_split]}
  class_names = tuple(str(digit) for digit in range(10))
  return _in_memory_source('digits', class_names, splits, process_index, process_count)


# ------------------------------------------------------------------------------ TFDS


def _tfds_reader(builder, split, decoders, image_feature):
  """(index -> record in tf ops, number of records) of a TFDS split read by index, or (None, 0).

  Random access needs the dataset stored as ArrayRecord (`tfds build --file_format=array_record`);
  tfrecord files can only be read in order.
  """
  try:
    data_source = builder.as_data_source(split=split, decoders=decoders)
  except (NotImplementedError, ValueError, TypeError) as e:
    logging.info('TFDS dataset %s is read in order (no random access: %s).', builder.name, e)
    return None, 0
  image_dtype = tf.string if decoders else image_feature.dtype

  def fetch(index):
    example = data_source[int(index)]
    return np.asarray(example['image']), np.int64(example['label'])

  def read_train(index):
    image, label = tf.numpy_function(fetch, [index], [image_dtype, tf.int64], stateful=False)
    return {'image': tf.ensure_shape(image, [] if decoders else image_feature.shape),
            'label': tf.ensure_shape(label, [])}

  return read_train, len(data_source)


def load_tfds(config: ml_collections.ConfigDict, process_index: int, process_count: int,
              builder=None) -> Source:
  """A TFDS dataset with an 'image' feature and a 'label' ClassLabel feature."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = config.dataset
  if builder is None:
    builder = tfds.builder(name, data_dir=config.tfds_data_dir)
  tfds_common.prepare(builder, name, config, tfds)
  features = builder.info.features
  label_feature = features['label'] if 'label' in features else None
  if 'image' not in features or not isinstance(label_feature, tfds.features.ClassLabel):
    raise errors.ConfigError(f"TFDS dataset {name!r} needs an 'image' feature and a 'label' "
                             "ClassLabel feature to be used for classification; its features are "
                             f"{features}.")
  image_feature = features['image']
  skip_decoding = isinstance(image_feature, tfds.features.Image)

  def host_split(split, index):
    return tfds.split_for_jax_process(split, process_index=index, process_count=process_count)

  decoders = {'image': tfds.decode.SkipDecoding()} if skip_decoding else None
  train_split = host_split(config.train_split, process_index)
  test_split = host_split(config.test_split, process_index)

  @as_written
  def image_and_label(example):
    return {'image': example['image'], 'label': example['label']}

  def records(split, **kwargs):
    return builder.as_dataset(split=split, decoders=decoders, **kwargs).map(image_and_label)

  def train(shuffle_seed):
    return records(train_split, shuffle_files=True,
                   read_config=tfds.ReadConfig(shuffle_seed=shuffle_seed))

  read_train, local_num_train = _tfds_reader(builder, train_split, decoders, image_feature)
  if read_train is None:
    local_num_train = tfds_common.split_size(builder, train_split)

  def test():
    return records(test_split, shuffle_files=False)

  def decode(record):
    image = image_feature.decode_example(record['image']) if skip_decoding else record['image']
    return {'image': image, 'label': tf.cast(record['label'], tf.int32)}

  test_shares = [tfds_common.split_size(builder, host_split(config.test_split, i))
                 for i in range(process_count)]
  return Source(
      name=name,
      num_classes=label_feature.num_classes,
      num_train_examples=tfds_common.split_size(builder, config.train_split),
      num_test_examples=tfds_common.split_size(builder, config.test_split),
      local_num_train_examples=local_num_train,
      local_num_test_examples=test_shares[process_index],
      max_local_test_examples=max(test_shares),
      read_train=read_train,
      train=train if read_train is None else None,
      test=test,
      decode=decode,
      encoded=(lambda record: record['image']) if skip_decoding else None,
      class_names=tuple(label_feature.names))


# ------------------------------------------------------------------------------ Image folders


def _has_image_signature(path: str) -> bool:
  """True when the file starts like a PNG or a JPEG."""
  try:
    with open(path, 'rb') as f:
      head = f.read(len(_PNG_SIGNATURE))
  except OSError:
    return False
  return head.startswith(_PNG_SIGNATURE) or head.startswith(_JPEG_SIGNATURE)


def list_class_dirs(split_dir: str) -> list[str]:
  """The class directories of an image folder's split, sorted (their index is the label)."""
  return [name for name in files.listdir(split_dir)
          if not name.startswith('.') and files.isdir(files.join(split_dir, name))]


def _list_images(split_dir: str,
                 class_names: list[str]) -> tuple[list[str], list[int], list[str]]:
  """Image file paths (sorted per class), their labels = index into class_names, and the
  class folders' other files (not hidden, not IMAGE_EXTENSIONS: .webp, .tiff, notes...)."""
  paths, labels, others = [], [], []
  for label, class_name in enumerate(class_names):
    class_dir = os.path.join(split_dir, class_name)
    if not os.path.isdir(class_dir):
      continue  # A class with no examples in this split.
    names = sorted(entry.name for entry in os.scandir(class_dir)
                   if entry.is_file() and not entry.name.startswith('.'))
    for name in names:
      if name.lower().endswith(IMAGE_EXTENSIONS):
        paths.append(os.path.join(class_dir, name))
        labels.append(label)
      else:
        others.append(os.path.join(class_dir, name))
  return paths, labels, others


def _drop_non_images(paths: list[str], labels: list[int]) -> tuple[list[str], list[int], list[str]]:
  """Splits off the files that are not PNG/JPEG by content (empty, truncated, HTML, ...)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
    is_image = list(pool.map(_has_image_signature, paths))
  kept = [(p, l) for p, l, ok in zip(paths, labels, is_image) if ok]
  skipped = [p for p, ok in zip(paths, is_image) if not ok]
  return [p for p, _ in kept], [l for _, l in kept], skipped


def load_folder(config: ml_collections.ConfigDict, process_index: int,
                process_count: int) -> Source:
  """Images in DIR/<split>/<class>/*.{jpg,jpeg,png}; labels are the sorted class names' indices.

  Classes come from the train split's subdirectories. Files whose content is not PNG/JPEG are
  skipped with a warning (count and first names) and listed in `Source.skipped_files`; files that
  look like PNG/JPEG but fail to decode while reading are dropped with a TensorFlow warning.
  """
  root = os.path.expanduser(config.dataset)
  split_dirs = {key: os.path.join(root, config[key]) for key in ('train_split', 'test_split')}
  for key, split_dir in split_dirs.items():
    if not os.path.isdir(split_dir):
      raise errors.ConfigError(f'Image folder {root!r} has no {config[key]!r} subdirectory '
                               f'(config.data.{key}); expected the layout {_FOLDER_LAYOUT}.')
  class_names = list_class_dirs(split_dirs['train_split'])
  unknown = sorted(set(list_class_dirs(split_dirs['test_split'])) - set(class_names))
  if unknown:
    raise errors.ConfigError(f'Test folder {split_dirs["test_split"]!r} has classes {unknown} that '
                             f'the train folder {split_dirs["train_split"]!r} does not have; '
                             'labels come from the train folder, so every test class needs a '
                             'train folder too.')

  shares, sizes, skipped_files = {}, {}, []
  for key, split_dir in split_dirs.items():
    paths, labels, others = _list_images(split_dir, class_names)
    extensions = '/'.join(IMAGE_EXTENSIONS)
    if not paths and others:
      raise errors.ConfigError(f'No {extensions} images in {split_dir!r}: its {len(others)} '
                               f'file(s) are of other types (e.g. {others[0]}); convert them to '
                               'PNG or JPEG.')
    if not paths:
      raise errors.ConfigError(f'No images in {split_dir!r}: expected the layout {_FOLDER_LAYOUT}.')
    if others:
      # Every host lists the whole folder: said once, by process 0.
      progress.log(f'Left out {len(others)} file(s) in {split_dir} whose names do not end in '
                   f'{extensions}, e.g. {others[0]} (convert them to PNG or JPEG to use them).')
    present = set(labels)
    empty = [name for label, name in enumerate(class_names) if label not in present]
    if key == 'train_split' and empty:  # Each would be a class the model is asked to learn.
      raise errors.ConfigError(f'Train folder {split_dir!r} has class folders with no images: '
                               f'{empty}; remove them, or put their images in.')
    if key == 'train_split' and len(class_names) == 1:  # 100% accuracy, loss 0, from step 1.
      raise errors.ConfigError(
          f'Train folder {split_dir!r} has one class folder, {class_names[0]!r}: a classifier '
          f'needs two or more. Expected the layout {_FOLDER_LAYOUT}, a folder per class.')
    paths, labels, skipped = _drop_non_images(paths, labels)
    if skipped:
      skipped_files.extend(skipped)
      progress.log(f'Skipped {len(skipped)} of {len(paths) + len(skipped)} files in '
                   f'{split_dir} that are not PNG or JPEG images, e.g. {skipped[0]}.')
    if not paths:
      raise errors.ConfigError(f'None of the image files in {split_dir!r} is a PNG or JPEG image.')
    # A fixed shuffle so that each host's contiguous share holds all classes.
    order = np.random.default_rng(0).permutation(len(paths))
    start, stop = host_range(len(paths), process_index, process_count)
    share = order[start:stop]
    shares[key] = {'path': np.array(paths, dtype=object)[share].astype(str),
                   'label': np.array(labels, dtype=np.int32)[share]}
    sizes[key] = len(paths)

  def columns(key):
    # An empty share (more hosts than images) still needs typed columns.
    paths, labels = shares[key]['path'], shares[key]['label']
    return {'path': tf.constant(paths, tf.string, shape=[len(paths)]),
            'label': tf.constant(labels, tf.int32)}

  train_columns, test_columns = columns('train_split'), columns('test_split')

  def read_train(index):
    return {key: tf.gather(column, index) for key, column in train_columns.items()}

  def decode(record):
    image = tf.io.decode_image(tf.io.read_file(record['path']), channels=config.channels,
                               expand_animations=False)
    return {'image': image, 'label': record['label']}

  return Source(
      name=root,
      num_classes=len(class_names),
      num_train_examples=sizes['train_split'],
      num_test_examples=sizes['test_split'],
      local_num_train_examples=len(shares['train_split']['label']),
      local_num_test_examples=len(shares['test_split']['label']),
      max_local_test_examples=-(-sizes['test_split'] // process_count),
      read_train=read_train,
      train=None,
      test=lambda: tf.data.Dataset.from_tensor_slices(test_columns),
      decode=decode,
      encoded=lambda record: tf.io.read_file(record['path']),
      decode_can_fail=True,
      record_name=lambda split, index: tf.gather(
          (train_columns if split == 'train' else test_columns)['path'], index),
      skipped_files=tuple(skipped_files),
      class_names=tuple(class_names))


# ------------------------------------------------------------------------------ Dispatch


def _unknown_dataset_error(config: ml_collections.ConfigDict,
                           tfds_error: Exception) -> errors.ConfigError:
  name = config.dataset
  if os.path.isdir(os.path.expanduser(name)):
    as_folder = (f'a directory, but without a {config.train_split!r} subdirectory for an image '
                 f'folder ({_FOLDER_LAYOUT})')
  else:
    as_folder = 'not an existing directory'
  suggestion = tfds_common.suggestion(name)
  return errors.ConfigError(
      f"Unknown dataset {name!r} (config.data.dataset): it is not 'digits', it is {as_folder}, and "
      'it is neither a registered TFDS builder nor a dataset prepared in '
      f'tfds_data_dir={config.tfds_data_dir!r} ({type(tfds_error).__name__}).{suggestion}')


def _folder_error(config: ml_collections.ConfigDict) -> errors.ConfigError:
  folder = config.dataset
  if os.path.isdir(os.path.expanduser(folder)):
    problem = f'has no {config.train_split!r} subdirectory (config.data.train_split)'
  else:
    problem = 'does not exist'
  return errors.ConfigError(f'Image folder {folder!r} (config.data.dataset) {problem}; '
                            f'expected the layout {_FOLDER_LAYOUT}.')


def load(config: ml_collections.ConfigDict, process_index: int, process_count: int) -> Source:
  """'digits', then an image folder (a directory with a train_split subdirectory), then TFDS.

  Names starting with '/', '.' or '~' are folder paths and never TFDS names.
  """
  name = config.dataset
  if name == 'digits':
    return load_digits(config, process_index, process_count)
  if os.path.isdir(os.path.join(os.path.expanduser(name), config.train_split)):
    return load_folder(config, process_index, process_count)
  if name.startswith(('/', '.', '~')):
    raise _folder_error(config)
  builder = tfds_common.find_builder(name, config.tfds_data_dir,
                         lambda error: _unknown_dataset_error(config, error))
  return load_tfds(config, process_index, process_count, builder=builder)
