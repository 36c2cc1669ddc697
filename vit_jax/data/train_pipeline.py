"""The image train stream: records by position, decoded, augmented and batched.

Position p of a host's stream (p = step * batch_size + row) is record
`train_order.record_index(p)`, so a run resumed at step N starts reading at position
N * batch_size. Every random choice is seeded by position (crop, flip, RandAugment) or step
(erasing, mixup), so the stream is the same whether or not the run stopped. With
`config.repeated_augmentation` N > 1 each record comes N times in a row, at N positions, so
each copy is augmented differently (DeiT's repeated augmentation). Records that fail to
decode keep their position (see `train_order.fill_failed_rows`).

Images of one size are batched first and preprocessed as whole batches; images of varying
sizes are preprocessed one by one, and with the inception crop a JPEG decodes only its window.
"""

import dataclasses

import ml_collections
import numpy as np

from vit_jax import progress
from vit_jax.data import erasing, mixing, preprocess, train_order
from vit_jax.data.tf_cpu import as_written, tf

# Shuffle buffer of TFDS datasets read as a stream (tfrecord) when config.shuffle_buffer is 0.
STREAM_SHUFFLE_BUFFER = 10_000
_AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Seeds:
  shuffle: int  # The order of each epoch.
  augment: int  # Crops, flips, RandAugment: with the position.
  batch: int  # Random erasing, mixup and CutMix: with the step.


def _failed(shape) -> dict:
  """The example in the place of a record that failed to decode."""
  return {'image': tf.zeros(shape, tf.uint8), 'label': tf.constant(0, tf.int32),
          'ok': tf.constant(False)}


def _order_seed(config, shuffle_seed: int) -> int | None:
  """The seed of each epoch's order of records read by index; None keeps their order."""
  return None if config.shuffle_buffer == 1 else shuffle_seed


def _warning(source, order_seed: int | None, repeats: int = 1):
  """position -> the warning line for its record when it cannot be decoded, naming it (an
  image file's path); None where the source does not name its records."""
  if source.record_name is None:
    return None
  num_records = source.local_num_train_examples
  return lambda position: train_order.undecodable(
      source.record_name('train', train_order.record_index(position, num_records, order_seed,
                                                           repeats)),
      'another image of its batch takes its place.')


def _decoded(source, config, records, start: int, warning=None):
  """(position, record) -> (position, {'image': uint8, 'label': int32, 'ok': bool}).

  A record that fails to decode keeps its position, with a 1x1 image and 'ok' False, and
  `warning(position)` on stderr.
  """
  @as_written
  def decode(position, record):
    example = source.decode(record) if source.decode else record
    return position, {**example, 'ok': tf.constant(True)}

  if source.decode_can_fail:
    return train_order.failsafe_map(records, decode, _failed([1, 1, config.channels]),
                                    start, warning)
  return records.map(decode, num_parallel_calls=_AUTOTUNE)


def _cached_reader(source, config):
  """index -> decoded train example, from this host's train split decoded once into memory.

  The images are kept as one flat uint8 variable with each image's offset and shape, so that
  reading one stays in TensorFlow (no Python, no GIL) whatever the image sizes.
  """
  records = tf.data.Dataset.range(source.local_num_train_examples).map(
      as_written(lambda index: (index, source.read_train(index))))
  decoded = _decoded(source, config, records, start=0, warning=_warning(source, None))
  with progress.phase(f'Decoding the {source.local_num_train_examples} train images of this '
                      'host into memory (config.data.cache)'):
    examples = [example for _, example in decoded.as_numpy_iterator()]
  shapes = np.array([example['image'].shape for example in examples], np.int64)  # (n, 3)
  offsets = np.concatenate([[0], np.cumsum(np.prod(shapes, axis=1))])  # (n + 1,)
  pixels = tf.Variable(np.concatenate([example['image'].ravel() for example in examples]),
                       trainable=False)
  labels = tf.constant([example['label'] for example in examples], tf.int32)
  ok = tf.constant([example['ok'] for example in examples], tf.bool)
  one_shape = len({tuple(shape) for shape in shapes}) == 1
  image_shape = tuple(shapes[0]) if one_shape else (None, None, config.channels)

  def read(index):
    start = tf.gather(offsets, index)
    image = tf.reshape(pixels[start:tf.gather(offsets, index + 1)], tf.gather(shapes, index))
    return {'image': tf.ensure_shape(image, image_shape), 'label': tf.gather(labels, index),
            'ok': tf.gather(ok, index)}

  read.pixels = pixels  # Kept alive with the reader.
  return read


def _records(source, config, shuffle_seed: int, start: int):
  """(position, record) from `start` on; with config.cache, decoded examples already."""
  if source.read_train is None:  # A stream: what comes before `start` is read, not decoded.
    buffer = STREAM_SHUFFLE_BUFFER if config.shuffle_buffer == 0 else config.shuffle_buffer
    records = source.train(shuffle_seed)
    if config.cache:  # Decode once, keep in memory, shuffle the decoded examples.
      records = records.map(as_written(source.decode), num_parallel_calls=_AUTOTUNE).cache()
      records = records.map(as_written(lambda example: {**example, 'ok': tf.constant(True)}))
    records = records.shuffle(buffer, seed=shuffle_seed).repeat()
    if config.repeated_augmentation > 1:  # Each record that many times in a row.
      records = records.flat_map(
          lambda record: tf.data.Dataset.from_tensors(record).repeat(config.repeated_augmentation))
    return records.skip(start).enumerate(start=start)
  indices = train_order.positions(start, source.local_num_train_examples,
                                  _order_seed(config, shuffle_seed), config.repeated_augmentation)
  read = _cached_reader(source, config) if config.cache else source.read_train
  return indices.map(as_written(lambda position, index: (position, read(index))),
                     num_parallel_calls=_AUTOTUNE)


def train_dataset(source, config: ml_collections.ConfigDict, num_classes: int, seeds: Seeds,
                  batch_size: int, start_step: int):
  """Batch `start_step` onwards of a host's endless train stream (see `ImageDataset`)."""
  start = start_step * batch_size
  size, channels = config.image_size, config.channels

  def seed_for(index):
    return tf.stack([tf.constant(seeds.augment, tf.int64), index])

  @as_written
  def preprocess_batch(positions, batch):
    step = positions[0] // batch_size
    crops = preprocess.train_crops(batch['image'], seed_for(step), config)
    return step, {**batch, 'image': preprocess.randaugment_images(crops, seed_for(step), config)}

  if source.decode is None and source.read_train is not None and not config.cache:
    # Arrays (digits): read, crop and augment whole batches at once.
    batches = train_order.position_batches(start, batch_size, source.local_num_train_examples,
                                           _order_seed(config, seeds.shuffle),
                                           config.repeated_augmentation)
    batches = batches.map(
        as_written(lambda positions, indices: (positions, source.read_train(indices))))
    return _finished(batches.map(preprocess_batch, num_parallel_calls=_AUTOTUNE), source,
                     config, num_classes, seeds)
  records = _records(source, config, seeds.shuffle, start)
  warning = _warning(source, _order_seed(config, seeds.shuffle), config.repeated_augmentation)
  examples = records if config.cache else _decoded(source, config, records, start, warning)
  if examples.element_spec[1]['image'].shape.is_fully_defined():
    # Images of one size: batch first, then preprocess whole batches (~10x less CPU).
    batches = examples.batch(batch_size, drop_remainder=True)
    batches = batches.map(preprocess_batch, num_parallel_calls=_AUTOTUNE)
  else:
    if not config.cache and source.encoded is not None and config.train_crop == 'inception_crop':
      # Decoding and cropping in one: a JPEG decodes only the crop's window.
      @as_written
      def crop_record(position, record):
        crops = preprocess.train_crops(source.encoded(record), seed_for(position), config,
                                       encoded=True)
        return position, {'image': crops[0], 'label': tf.cast(record['label'], tf.int32),
                          'ok': tf.constant(True)}

      if source.decode_can_fail:
        examples = train_order.failsafe_map(
            records, crop_record, _failed([size, size, channels]), start, warning)
      else:
        examples = records.map(crop_record, num_parallel_calls=_AUTOTUNE)

      if config.randaugment_layers > 0 and config.randaugment_magnitude > 0:
        @as_written
        def randaugment_example(position, example):
          images = preprocess.randaugment_images(example['image'][None], seed_for(position),
                                                 config)
          return position, {**example, 'image': images[0]}

        examples = examples.map(randaugment_example, num_parallel_calls=_AUTOTUNE)
    else:
      # Images of varying sizes: preprocess each (as a batch of one) to the common size.
      @as_written
      def preprocess_example(position, example):
        crops = preprocess.train_crops(example['image'][None], seed_for(position), config)
        images = preprocess.randaugment_images(crops, seed_for(position), config)
        return position, {**example, 'image': images[0]}

      examples = examples.map(preprocess_example, num_parallel_calls=_AUTOTUNE)
    batches = examples.batch(batch_size, drop_remainder=True).map(
        as_written(lambda positions, batch: (positions[0] // batch_size, batch)))

  return _finished(batches, source, config, num_classes, seeds)


def _finished(batches, source, config, num_classes: int, seeds: Seeds):
  """(step, uint8 batch) -> the batches the trainer takes: failed rows filled, float32, mixed."""
  @as_written
  def finish(step, batch):
    if source.decode_can_fail:
      batch = train_order.fill_failed_rows(batch)
    else:
      batch.pop('ok', None)
    # uint8 until here: 4x less to copy.
    batch['image'] = preprocess.normalize(batch['image'], config)
    batch_seed = tf.stack([tf.constant(seeds.batch, tf.int64), step])
    if config.random_erasing_prob > 0:
      erasing_seed = tf.random.experimental.stateless_fold_in(batch_seed, 1)
      batch['image'] = erasing.random_erasing(batch['image'], config.random_erasing_prob,
                                              erasing_seed)
    if config.mixup_alpha > 0 or config.cutmix_alpha > 0:
      batch['image'], batch['label'] = mixing.mix(
          batch['image'], batch['label'], num_classes, config.mixup_alpha, config.cutmix_alpha,
          config.cutmix_prob, batch_seed)
    return batch

  return batches.map(finish, num_parallel_calls=_AUTOTUNE).prefetch(config.prefetch)
