"""`config.data.dataset = 'synthetic'`: random ready-made batches, made in numpy, no TensorFlow.

For timing the trainer where the input pipeline is not the question (or TensorFlow is not
installed, as on some GPU images): the batches are what the image pipeline emits after
preprocessing, float32 (B, H, W, C) uniform in [-1, 1] with random int32 labels, so no crop,
flip or resize runs. Two train batches per batch size are made once and alternate, so every
step still copies a fresh host array to the devices; batch `s` is the same whether or not the
run resumed. Eval batches alternate likewise over the test split's size, padded like the image
pipeline's. Split sizes and the class count are `config.synthetic_*` (ImageNet's by default).
"""

from typing import Iterator

import ml_collections
import numpy as np

from vit_jax import errors
from vit_jax.data.hosts import host_range

_POOL = 2  # Distinct batches per iterator; they alternate.


def check(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict):
  """One-line errors for settings that synthetic batches cannot honour, or that need them."""
  synthetic_keys = [k for k in defaults if k.startswith('synthetic_')]
  if config.dataset != 'synthetic':
    changed = [f'{k}={config[k]!r}' for k in synthetic_keys if config[k] != defaults[k]]
    if changed:
      raise errors.ConfigError(
          f"Only dataset 'synthetic' reads config.data.{', '.join(changed)}, and the dataset "
          f"is {config.dataset!r}: leave {'it' if len(changed) == 1 else 'them'} out, or set "
          '--config.data.dataset=synthetic.')
    return
  for key in synthetic_keys:
    if not isinstance(config[key], int) or isinstance(config[key], bool) or config[key] < 1:
      raise errors.ConfigError(f'config.data.{key}={config[key]!r}: expected an int >= 1.')
  augmentations = ('mixup_alpha', 'cutmix_alpha', 'randaugment_layers', 'random_erasing_prob',
                   'repeated_augmentation')
  on = [f'{key}={config[key]}' for key in augmentations if config[key] != defaults[key]]
  if on:
    raise errors.ConfigError(
        f"config.data.dataset='synthetic' makes ready-made batches, so {' and '.join(on)} "
        f"cannot apply: leave {'it' if len(on) == 1 else 'them'} out.")
  if (config.train_split, config.test_split) != ('train', 'test'):
    raise errors.ConfigError(
        f"config.data.dataset='synthetic' has the splits 'train' and 'test', not "
        f'{config.train_split!r} and {config.test_split!r}: set config.data.train_split=train '
        'and config.data.test_split=test (sizes: config.data.synthetic_*_examples).')


class SyntheticDataset:
  """One host's share of random images and labels, with `images.ImageDataset`'s interface."""

  def __init__(self, config: ml_collections.ConfigDict, process_index: int, process_count: int):
    self.config = config
    self.name = 'synthetic'
    self.num_classes = config.synthetic_classes
    self.class_names = ()
    self.skipped_files = ()
    self.num_train_examples = config.synthetic_train_examples
    self.num_test_examples = config.synthetic_test_examples
    self._process_index = process_index
    self.local_num_train_examples = self._share(self.num_train_examples, process_index,
                                                process_count)
    self.local_num_test_examples = self._share(self.num_test_examples, process_index,
                                               process_count)
    self._max_local_test_examples = self._share(self.num_test_examples, 0, process_count)
    self.image_shape = (config.image_size, config.image_size, config.channels)

  @staticmethod
  def _share(num_examples: int, process_index: int, process_count: int) -> int:
    start, stop = host_range(num_examples, process_index, process_count)
    return stop - start

  def __repr__(self):
    return (f'SyntheticDataset(num_classes={self.num_classes}, train={self.num_train_examples}, '
            f'test={self.num_test_examples}, image_shape={self.image_shape})')

  def _pool(self, batch_size: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng([seed, self._process_index])
    pool = []
    for _ in range(_POOL):
      image = rng.random((batch_size, *self.image_shape), np.float32)
      pool.append({'image': 2 * image - 1,  # (batch, height, width, channels) in [-1, 1).
                   'label': rng.integers(0, self.num_classes, batch_size).astype(np.int32)})
    return pool

  def train_batches(self, batch_size: int, seed: int = 0,
                    start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Endless {'image': float32 (B, H, W, C), 'label': int32 (B,)}; batch s is pool[s % 2]."""
    pool = self._pool(batch_size, seed)
    step = start_step
    while True:
      yield pool[step % _POOL]
      step += 1

  def num_eval_batches(self, batch_size: int) -> int:
    return -(-self._max_local_test_examples // batch_size)

  def eval_batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """num_eval_batches batches {'image', 'label', 'mask'}; mask 0 past this host's share."""
    pool = self._pool(batch_size, seed=1 << 20)
    for index in range(self.num_eval_batches(batch_size)):
      real = np.clip(self.local_num_test_examples - index * batch_size, 0, batch_size)
      mask = (np.arange(batch_size) < real).astype(np.float32)
      yield {**pool[index % _POOL], 'mask': mask}
