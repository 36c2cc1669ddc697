"""TFDS splits read for evaluation only: one host's share, preprocessed like the test split.

  split = eval_sets.open_split('imagenet_v2', 'test', data_config, label_fields,
                               process_index=0, process_count=1)
  for batch in split.batches(batch_size):  # split.num_batches(batch_size), as on every host.
    ...  # {'image': float32 (B, H, W, C) normalized, <label_fields' keys>, 'mask': float32 (B,)}

Each host reads its `tfds.split_for_jax_process` share in a fixed order; shares are padded to the
same number of batches with mask-0 examples (zeros), as `ImageDataset.eval_batches` pads the test
split. Importing this module is cheap; TensorFlow is imported by `open_split`.
"""

from typing import Callable, Iterator

import ml_collections
import numpy as np

from vit_jax import errors
from vit_jax.data import images, tfds_common

_LABEL_READ_BATCH = 4096  # Labels per batch when a split's labels are read without its images.


class EvalSplit:
  """One host's share of a TFDS split, as padded batches of preprocessed images and labels.

  Attributes:
    name: the TFDS dataset name.
    split: the split read ('test', 'validation', ...).
    features: the builder's FeaturesDict.
    num_examples: examples in the whole split (all hosts together).
    local_num_examples: examples in this host's share.
  """

  def __init__(self, builder, split: str, config: ml_collections.ConfigDict,
               label_fields: Callable[[dict], dict], process_index: int, process_count: int):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    self._builder = builder
    self._config = config
    self._label_fields = label_fields
    self._host_split = tfds.split_for_jax_process(split, process_index=process_index,
                                                  process_count=process_count)
    self._datasets = {}  # batch_size -> tf.data.Dataset, reused so that caching pays off.
    self.name = builder.name
    self.split = split
    self.features = builder.info.features
    shares = [tfds_common.split_size(builder, tfds.split_for_jax_process(
        split, process_index=index, process_count=process_count))
              for index in range(process_count)]
    self.num_examples = sum(shares)
    self.local_num_examples = shares[process_index]
    self._max_local_examples = max(shares)
    if not self.num_examples:
      raise errors.ConfigError(f'Split {split!r} of TFDS dataset {self.name!r} is empty: there is '
                               'nothing to evaluate; prepare the dataset again or drop it.')

  def __repr__(self):
    return (f'EvalSplit({self.name!r}, {self.split!r}, examples={self.num_examples}, '
            f'local={self.local_num_examples})')

  def num_batches(self, batch_size: int) -> int:
    """Batches per `batches` pass; the same on every host (some end with padding only)."""
    return -(-self._max_local_examples // batch_size)

  def _dataset(self, batch_size: int):
    from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
    from vit_jax.data.tf_cpu import as_written, tf  # pylint: disable=g-import-not-at-top
    config = self._config

    @as_written
    def preprocess_example(example):
      return {'image': preprocess.eval_images(example['image'], config),
              **self._label_fields(example),
              'mask': tf.constant(1.0, tf.float32)}

    records = self._builder.as_dataset(split=self._host_split, shuffle_files=False)
    examples = records.map(preprocess_example, num_parallel_calls=tf.data.AUTOTUNE)
    return images.padded_batches(examples, self.num_batches(batch_size), batch_size, config)

  def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """One deterministic pass over this host's share, padded to num_batches(batch_size) batches.

    Yields {'image': float32 (batch_size, H, W, C), <label fields>, 'mask': float32 (batch_size,)}:
    mask 1 for real examples, 0 for padding (zero images and labels). Across hosts every example
    of the split appears exactly once with mask 1.
    """
    if batch_size not in self._datasets:
      self._datasets[batch_size] = self._dataset(batch_size)
    return self._datasets[batch_size].as_numpy_iterator()

  def labels_present(self, label_feature: str = 'label') -> np.ndarray:
    """The sorted distinct values of `label_feature` in the whole split (images not decoded)."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from vit_jax.data.tf_cpu import as_written  # pylint: disable=g-import-not-at-top
    records = self._builder.as_dataset(split=self.split, shuffle_files=False,
                                       decoders={'image': tfds.decode.SkipDecoding()})
    labels = records.map(as_written(lambda example: example[label_feature]))
    labels = labels.batch(_LABEL_READ_BATCH)
    found = [np.asarray(batch) for batch in labels.as_numpy_iterator()]
    return np.unique(np.concatenate(found)) if found else np.zeros((0,), np.int64)


def open_split(name: str, split: str, config: ml_collections.ConfigDict,
               label_fields: Callable[[dict], dict], required_features: tuple[str, ...],
               process_index: int, process_count: int) -> EvalSplit:
  """Finds (and if needed prepares) TFDS dataset `name` and opens this host's share of `split`.

  Args:
    name: a TFDS name ('imagenet_v2', 'imagenet2012_real', ...).
    split: the split to read.
    config: the run's data config: image_size, channels and eval_resize_ratio shape the images;
      tfds_data_dir, tfds_manual_dir, tfds_download(_retries), cache and prefetch apply as to the
      test split.
    label_fields: decoded TFDS example -> {key: tensor of a fixed shape} kept besides the image.
    required_features: the features `label_fields` reads (besides 'image').
    process_index: this host's index.
    process_count: number of hosts.

  Raises:
    ConfigError: the dataset lacks an 'image' or a required feature, or the split is empty.
    DataUnavailableError: the dataset is not prepared and cannot be prepared here.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def unknown(error):
    return errors.ConfigError(f'TFDS does not know dataset {name!r} ({type(error).__name__}: '
                              f'{error}); update tensorflow-datasets or drop this evaluation.')

  builder = tfds_common.find_builder(name, config.tfds_data_dir, unknown)
  tfds_common.prepare(builder, name, config, tfds)
  missing = [key for key in ('image', *required_features) if key not in builder.info.features]
  if missing:
    raise errors.ConfigError(f'TFDS dataset {name!r} has no {missing} feature(s) to evaluate on; '
                             f'its features are {sorted(builder.info.features)}.')
  return EvalSplit(builder, split, config, label_fields, process_index, process_count)
