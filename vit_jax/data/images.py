"""Image classification input pipeline: config, `build`, and per-host train/eval batch iterators.

  ds = images.build(config.data, process_index=jax.process_index(),
                    process_count=jax.process_count())
  for batch in ds.train_batches(batch_size=local_batch, seed=config.seed):  # Endless.
    ...  # {'image': float32 (B, H, W, C) normalized (default [-1, 1]), 'label': int32 (B,)}
         # (with mixup or CutMix, 'label' is float32 (B, num_classes) soft labels summing to 1).
  for batch in ds.eval_batches(batch_size=local_batch):  # One pass over this host's test share.
    ...  # {'image', 'label': int32 (B,), 'mask': float32 (B,)}; padding examples have mask 0.

Importing this module is cheap; TensorFlow is imported by `build`.
"""

import re
from typing import Iterator

import ml_collections
from ml_collections import config_dict
import numpy as np

from vit_jax import errors, files, native_logs
from vit_jax.data import checks, hosts, normalization, synthetic

_AUTOTUNE = -1  # tf.data.AUTOTUNE, spelled out so that building a config needs no TensorFlow.
TRAIN_CROPS = ('inception_crop', 'resize_random_crop', 'pad_random_crop', 'resize')
EVAL_RESIZES = ('square', 'shorter_side')
INTERPOLATIONS = ('bilinear', 'bicubic')


def default_config() -> ml_collections.ConfigDict:
  """Every data knob with its default; defaults suit the embedded 'digits' dataset."""
  config = ml_collections.ConfigDict()
  # 'digits' (sklearn 8x8, embedded), a TFDS name ('cifar10', 'imagenet2012', 'oxford_iiit_pet',
  # ...), an image folder DIR laid out as DIR/{train,test}/<class>/*.{jpg,jpeg,png}, or
  # 'synthetic' (random ready-made batches, no TensorFlow: vit_jax.data.synthetic).
  config.dataset = 'digits'
  config.train_split = 'train'  # TFDS split ('train[:98%]'), folder subdirectory, digits 'train'.
  config.test_split = 'test'  # Likewise ('validation' for imagenet2012, 'train[98%:]', ...).
  # TFDS data_dir; None: TFDS's default ($TFDS_DATA_DIR or ~/...).
  config.tfds_data_dir = config_dict.placeholder(str)
  # Manually downloaded archives (imagenet2012); None: TFDS default.
  config.tfds_manual_dir = config_dict.placeholder(str)
  config.tfds_download = True  # Run download_and_prepare when the TFDS dataset is not prepared.
  # Retries of each download, with exponential backoff (so offline, many take minutes to fail).
  config.tfds_download_retries = 10
  config.image_size = 8  # Model input resolution (square); 8 is digits' own size.
  config.channels = 3  # 3: RGB (grayscale repeated, alpha dropped); 1: grayscale.
  # Pixels p become (p / 255 - pixel_mean) / pixel_std, per channel (one value: every channel).
  # 0.5, 0.5: [-1, 1], as Google's ViT; DeiT and timm's ImageNet models: ImageNet's statistics,
  # pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225).
  config.pixel_mean = normalization.INCEPTION_MEAN
  config.pixel_std = normalization.INCEPTION_STD
  # Train crop: 'inception_crop' | 'resize_random_crop' | 'pad_random_crop' | 'resize'.
  config.train_crop = 'pad_random_crop'
  config.inception_crop_min_area = 0.05  # inception_crop: smallest crop, as a fraction of area.
  config.resize_ratio = 1.14  # resize_random_crop: resize to image_size * ratio, then crop.
  # Train crop's resize kernel: 'bilinear' (Google's ViT; the inception crop samples its window
  # bilinearly, not antialiased, as big_vision) or 'bicubic' (timm, DeiT: antialiased, as PIL).
  config.train_interpolation = 'bilinear'
  config.crop_padding = 1  # pad_random_crop: zero pixels added per side before cropping back.
  config.eval_resize_ratio = 1.0  # Eval: resize to image_size * ratio, keep the central crop.
  # Eval resize: 'square' (both sides, aspect ratio not kept: Google's ViT) or 'shorter_side'
  # (aspect ratio kept: timm, DeiT, torchvision's Resize).
  config.eval_resize = 'square'
  # Eval resize kernel, antialiased: 'bilinear' (Google's ViT) or 'bicubic' (timm, DeiT).
  config.eval_interpolation = 'bilinear'
  config.flip = False  # Random horizontal flips in training (off: mirrored digits are no digits).
  config.randaugment_layers = 0  # RandAugment ops per image; 0 disables (2 is usual).
  config.randaugment_magnitude = 0.0  # RandAugment strength, 0..10 scale (up to 30); 0 disables.
  config.randaugment_fill = 128  # Gray level for pixels that RandAugment's geometric ops uncover.
  config.mixup_alpha = 0.0  # Mixup Beta(alpha, alpha) weight per batch; 0 disables (0.1-0.4).
  config.cutmix_alpha = 0.0  # CutMix Beta(alpha, alpha) box per batch; 0 disables (DeiT: 1.0).
  # With mixup_alpha and cutmix_alpha both > 0: the share of batches that take CutMix, not mixup.
  config.cutmix_prob = 0.5
  # Share of train images given one rectangle of N(0, 1) noise (random erasing, timm's 'pixel'
  # mode), before mixup and CutMix; 0 disables (DeiT: 0.25).
  config.random_erasing_prob = 0.0
  # Copies of each train image in a row of the stream, each augmented on its own (repeated
  # augmentation; DeiT: 3); an epoch of N examples then holds N / copies distinct images.
  config.repeated_augmentation = 1
  # 0: every epoch a new order of the whole split; 1: keep the order; N: a buffer of N, for TFDS
  # tfrecord datasets (read as a stream; 0 gives them 10,000).
  config.shuffle_buffer = 0
  config.prefetch = _AUTOTUNE  # Batches prepared ahead; -1: tf.data.AUTOTUNE.
  # Keep decoded train images (decoded once when training starts, resumed or not) and
  # preprocessed eval examples in memory.
  config.cache = False
  config.synthetic_classes = 1000  # dataset 'synthetic': label classes (ImageNet's).
  config.synthetic_train_examples = 1_281_167  # dataset 'synthetic': train split size.
  config.synthetic_test_examples = 50_000  # dataset 'synthetic': test split size.
  return config



def _checked_config(config) -> ml_collections.ConfigDict:
  """The defaults updated with `config`; unknown keys and out-of-range values raise ConfigError."""
  check = checks.Checks(default_config(), config, 'data config')
  c = check.config
  check.require_int('image_size', 1, 'an int > 0')
  check.require(c.channels in (1, 3), 'channels', '1 or 3')
  check.require(c.train_crop in TRAIN_CROPS, 'train_crop', f'one of {TRAIN_CROPS}')
  check.require_int('tfds_download_retries', 0)
  check.require(0 < c.inception_crop_min_area <= 1, 'inception_crop_min_area', 'in (0, 1]')
  check.require(c.resize_ratio >= 1, 'resize_ratio', '>= 1')
  check.require(c.eval_resize_ratio >= 1, 'eval_resize_ratio', '>= 1')
  check.require(c.eval_resize in EVAL_RESIZES, 'eval_resize', f'one of {EVAL_RESIZES}')
  check.require(c.train_interpolation in INTERPOLATIONS, 'train_interpolation',
                f'one of {INTERPOLATIONS}')
  check.require(c.eval_interpolation in INTERPOLATIONS, 'eval_interpolation',
                f'one of {INTERPOLATIONS}')
  check.require_int('crop_padding', 0)
  check.require_int('randaugment_layers', 0)
  check.require(0 <= c.randaugment_magnitude <= 30, 'randaugment_magnitude', 'in [0, 30]')
  check.require(0 <= c.randaugment_fill <= 255, 'randaugment_fill', 'in [0, 255]')
  check.require(c.mixup_alpha >= 0, 'mixup_alpha', '>= 0')
  check.require(c.cutmix_alpha >= 0, 'cutmix_alpha', '>= 0')
  check.require(0 <= c.cutmix_prob <= 1, 'cutmix_prob', 'in [0, 1]')
  check.require(0 <= c.random_erasing_prob <= 1, 'random_erasing_prob', 'in [0, 1]')
  check.require_int('repeated_augmentation', 1)
  check.require_int('shuffle_buffer', 0)
  check.require_int('prefetch', -1, '-1 (AUTOTUNE) or >= 0')
  config = check.result()
  mixes = config.mixup_alpha > 0 and config.cutmix_alpha > 0
  if config.cutmix_prob != default_config().cutmix_prob and not mixes:
    raise errors.ConfigError(
        f'config.data.cutmix_prob={config.cutmix_prob} chooses between mixup and CutMix, but '
        f'mixup_alpha={config.mixup_alpha} and cutmix_alpha={config.cutmix_alpha}: set both '
        '> 0, or leave cutmix_prob out.')
  normalization.of_config(config)
  synthetic.check(config, default_config())
  return config


def padded_batches(examples, num_batches: int, batch_size: int, config):
  """`examples` (a tf.data.Dataset of eval examples with a 'mask' of 1) followed by all-zero
  examples, as `num_batches` batches of `batch_size`, prefetched; with `config.cache` the
  padded examples are kept in memory after the first pass."""
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  padding = tf.data.Dataset.from_tensors(tf.nest.map_structure(
      lambda spec: tf.zeros(spec.shape, spec.dtype), examples.element_spec)).repeat()
  examples = examples.concatenate(padding).take(num_batches * batch_size)
  if config.cache:  # After the take, which it then reads to its end: kept for every pass.
    examples = examples.cache()
  return examples.batch(batch_size, drop_remainder=True).prefetch(config.prefetch)


class ImageDataset:
  """One host's input pipeline over a dataset: its sizes and its train/eval batch iterators.

  Attributes:
    name: what was loaded ('digits', the TFDS name, or the image folder).
    num_classes: number of label classes.
    class_names: the name of each label id (digits: '0'..'9'; TFDS: its label names; folders:
      the class directories).
    num_train_examples: examples in the whole train split (all hosts together).
    num_test_examples: examples in the whole test split (all hosts together).
    local_num_train_examples: examples in this host's share of the train split.
    local_num_test_examples: examples in this host's share of the test split.
    image_shape: (image_size, image_size, channels) of the preprocessed images.
    skipped_files: files of an image folder left out because they are not PNG/JPEG images.
  """

  def __init__(self, config: ml_collections.ConfigDict, source, process_index: int,
               process_count: int):
    self.config = config
    self._source = source
    self._process_index = process_index
    self._process_count = process_count
    self._eval_datasets = {}  # batch_size -> tf.data.Dataset, reused so that caching pays off.
    self.name = source.name
    self.num_classes = source.num_classes
    self.class_names = source.class_names
    self.num_train_examples = source.num_train_examples
    self.num_test_examples = source.num_test_examples
    self.local_num_train_examples = source.local_num_train_examples
    self.local_num_test_examples = source.local_num_test_examples
    self.image_shape = (config.image_size, config.image_size, config.channels)
    self.skipped_files = source.skipped_files

  def __repr__(self):
    return (f'ImageDataset({self.name!r}, num_classes={self.num_classes}, '
            f'train={self.num_train_examples}, test={self.num_test_examples}, '
            f'image_shape={self.image_shape}, host {self._process_index}/{self._process_count})')

  def _decoded_test(self):
    """This host's test records -> {'image': uint8, 'label': int32}; one that cannot be
    decoded is left out, with a warning naming it."""
    # pylint: disable=g-import-not-at-top
    from vit_jax.data import train_order
    from vit_jax.data.tf_cpu import as_written, tf
    source = self._source
    records = source.test()
    if source.decode is None:
      return records
    if not source.decode_can_fail:
      return records.map(as_written(source.decode), num_parallel_calls=tf.data.AUTOTUNE)

    @as_written
    def decode(position, record):
      return position, {**source.decode(record), 'ok': tf.constant(True)}

    failed = {'image': tf.zeros([1, 1, self.config.channels], tf.uint8),
              'label': tf.constant(0, tf.int32), 'ok': tf.constant(False)}
    warning = None if source.record_name is None else (
        lambda position: train_order.undecodable(source.record_name('test', position),
                                                 'evaluation leaves it out.'))
    decoded = train_order.failsafe_map(records.enumerate(), decode, failed, 0, warning,
                                       end=source.local_num_test_examples)
    return decoded.filter(as_written(lambda _, example: example['ok'])).map(
        as_written(lambda _, example: {'image': example['image'], 'label': example['label']}))

  def _seeds(self, seed: int) -> tuple[int, int, int]:
    """(shuffle, augmentation, batch) seeds: reproducible from `seed`, different on each host."""
    words = np.random.SeedSequence([seed, self._process_index]).generate_state(3)
    return tuple(int(w) for w in words)

  def train_dataset(self, batch_size: int, seed: int = 0, start_step: int = 0):
    """The endless tf.data.Dataset behind `train_batches` (for callers that want tf.data).

    Batch `start_step` onwards of the stream that `start_step=0` gives, so a resumed run sees
    the same batches as one that never stopped. Records before the resume point are not read
    (TFDS datasets stored as tfrecord: read, not decoded).
    """
    from vit_jax.data import train_pipeline  # pylint: disable=g-import-not-at-top
    seeds = train_pipeline.Seeds(*self._seeds(seed))
    return train_pipeline.train_dataset(self._source, self.config, self.num_classes, seeds,
                                        batch_size, start_step)

  def train_batches(self, batch_size: int, seed: int = 0,
                    start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Endless iterator over this host's shuffled, augmented train batches of numpy arrays.

    Yields {'image': float32 (batch_size, H, W, C), normalized, 'label': int32 (batch_size,)};
    with mixup or CutMix, 'label' is float32 (batch_size, num_classes), rows summing to 1.
    The same seed (and host) gives the same batches; the stream starts at batch `start_step`
    without reading the records of the batches before it.
    """
    return self.train_dataset(batch_size, seed, start_step).as_numpy_iterator()

  def num_eval_batches(self, batch_size: int) -> int:
    """Batches per `eval_batches` pass; the same on every host (some get all-padding batches)."""
    return -(-self._source.max_local_test_examples // batch_size)

  def _eval_dataset(self, batch_size: int):
    from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
    from vit_jax.data.tf_cpu import as_written, tf  # pylint: disable=g-import-not-at-top
    config = self.config

    @as_written
    def preprocess_example(example):
      return {'image': preprocess.eval_images(example['image'], config),
              'label': example['label'],
              'mask': tf.constant(1.0, tf.float32)}

    examples = self._decoded_test().map(
        preprocess_example, num_parallel_calls=tf.data.AUTOTUNE)
    return padded_batches(examples, self.num_eval_batches(batch_size), batch_size, config)

  def eval_batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """One deterministic pass over this host's test share, padded to whole batches.

    Yields num_eval_batches(batch_size) dicts {'image': float32 (batch_size, H, W, C),
    'label': int32 (batch_size,), 'mask': float32 (batch_size,)}: mask 1 for real examples, 0 for
    padding. Across hosts every test example appears exactly once with mask 1.
    """
    if batch_size not in self._eval_datasets:
      self._eval_datasets[batch_size] = self._eval_dataset(batch_size)
    return self._eval_datasets[batch_size].as_numpy_iterator()


# The first bytes of the formats tf.io.decode_image reads (WebP: RIFF, then WEBP at byte 8).
_SIGNATURES = (b'\x89PNG\r\n\x1a\n', b'\xff\xd8\xff', b'GIF87a', b'GIF89a', b'BM', b'RIFF')


def _has_decodable_signature(head: bytes) -> bool:
  return head.startswith(_SIGNATURES) and (not head.startswith(b'RIFF') or head[8:12] == b'WEBP')


def _unreadable(path: str, reason: str) -> errors.BadFileError:
  return errors.BadFileError(f'{path} is not an image that can be read (PNG, JPEG, GIF or BMP): '
                             f'{reason}')


# A line of TensorFlow's C++ logging: E0000 00:00:1796.45  9070 jpeg_mem.cc:331] Premature end...
_CPP_LOG_LINE = re.compile(r'[EW]\d{4} \S+\s+\d+ ([\w.]+):\d+\] (.*)')


def _decoded(path: str, contents, channels: int):
  """tf.io.decode_image of a file's contents. When it fails, what TensorFlow's C++ logging said
  (e.g. 'Premature end of JPEG data. Stopped at line 14/64') goes into the one-line error
  instead of onto the screen; its other lines pass on, but absl's preamble."""
  from vit_jax.data import tf_cpu  # pylint: disable=g-import-not-at-top
  logged = []
  try:
    with native_logs.stderr_captured() as logged:
      return tf_cpu.tf.io.decode_image(contents, channels=channels, expand_animations=False)
  except tf_cpu.tf.errors.InvalidArgumentError as e:
    said = [m for m in map(_CPP_LOG_LINE.match, logged) if m]
    logged = [line for line in logged if not _CPP_LOG_LINE.match(line)]
    details = [m.group(2).strip() for m in said if m.group(1) != 'local_rendezvous.cc']
    reason = re.sub(r'\{\{.*?\}\}|\[Op:.*', '', e.message).strip()
    raise _unreadable(path, '; '.join([*details, reason])) from None
  finally:
    native_logs.pass_on(logged, native_logs.ABSL_PREAMBLE)


def load_files(paths: list[str], config=None) -> np.ndarray:
  """Image files (PNG, JPEG, GIF or BMP, any size) -> model inputs like test images.

  Returns float32 (B, H, W, C), normalized. `config` is a data config (or dict); only
  image_size, channels, the eval_* fields, pixel_mean and pixel_std matter. Paths may be on
  any filesystem tf.io.gfile reaches, or http(s) URLs.

  Raises:
    MissingFileError: a file does not exist.
    BadFileError: a file is not an image (or is a truncated one).
  """
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  config = _checked_config(ml_collections.ConfigDict(config or {}))
  images = []
  for path in paths:
    if not files.is_web(path):  # A URL says it is missing when read.
      if not files.exists(path):
        raise errors.MissingFileError(f'Image file {path!r} does not exist.')
      if files.isdir(path):
        raise errors.ConfigError(f'Image file {path!r} is a directory; give image files.')
    contents = tf.constant(files.read_bytes(path))
    if not _has_decodable_signature(contents.numpy()[:12]):  # Else TF logs a C++ warning.
      raise _unreadable(path, 'its first bytes are those of none of these formats')
    image = _decoded(path, contents, config.channels)
    images.append(preprocess.eval_images(image, config).numpy())
  return np.stack(images)


def build(config, process_index: int | None = None,
          process_count: int | None = None) -> ImageDataset | synthetic.SyntheticDataset:
  """Builds the input pipeline described by `config` (see default_config) for one host.

  Args:
    config: the data ConfigDict (or dict); missing keys take default_config()'s values.
    process_index: this host's index; None: jax.process_index().
    process_count: number of hosts; None: jax.process_count().

  Returns:
    The ImageDataset for this host's share of the data.

  Raises:
    ValueError: unknown keys, invalid values, unknown dataset, or a malformed image folder.
    RuntimeError: a TFDS dataset that is not prepared and cannot be prepared here.
  """
  process_index, process_count = hosts.resolve_host(process_index, process_count)
  config = _checked_config(ml_collections.ConfigDict(config))
  if config.dataset == 'synthetic':
    return synthetic.SyntheticDataset(config, process_index, process_count)
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  source = sources.load(config, process_index, process_count)
  if source.read_train is not None and config.shuffle_buffer > 1:
    raise errors.ConfigError(
        f'config.data.shuffle_buffer={config.shuffle_buffer} applies to TFDS datasets stored as '
        f'tfrecord, which are read in order; {source.name!r} is read by index and gets a new '
        'order of the whole train split each epoch: set it to 0 (or 1 to keep the order).')
  return ImageDataset(config, source, process_index, process_count)
