"""mixup and CutMix (vit_jax.data.mixing), alone and together, and through the pipeline."""

import numpy as np
import pytest

from vit_jax import errors
from vit_jax.data import images, mixing
from vit_jax.data.tf_cpu import tf

BATCH, SIDE, CLASSES = 6, 16, 10


def _constant_examples():
  """Example i is filled with the value i and labelled i: a pixel tells whose it is."""
  values = np.arange(BATCH, dtype=np.float32)
  batch = np.broadcast_to(values[:, None, None, None], (BATCH, SIDE, SIDE, 3)).copy()
  return tf.constant(batch), tf.constant(np.arange(BATCH))


def _seed(i):
  return tf.constant([7, i], tf.int64)


@pytest.mark.parametrize('alpha', [0.3, 1.0])
def test_cutmix_pastes_one_box_of_the_neighbour_and_labels_by_the_area_kept(alpha):
  examples, labels = _constant_examples()
  sizes = []
  for i in range(40):
    mixed, soft = (x.numpy() for x in mixing.cutmix(examples, labels, CLASSES, alpha, _seed(i)))
    neighbour = np.roll(np.arange(BATCH), 1)
    for example in range(BATCH):
      own = mixed[example, :, :, 0] == example
      pasted = mixed[example, :, :, 0] == neighbour[example]
      assert np.all(own | pasted)  # Pixels are copied, never blended.
      assert np.all(mixed[example] == mixed[example, :, :, :1])  # All channels alike.
      rows, cols = np.nonzero(pasted)
      if rows.size:  # One axis-aligned box, whole.
        box = pasted[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        assert box.all() and box.size == rows.size
      np.testing.assert_allclose(soft[example, example], own.mean(), atol=1e-6)
      np.testing.assert_allclose(soft[example, neighbour[example]], pasted.mean(), atol=1e-6)
      np.testing.assert_allclose(soft[example].sum(), 1.0, atol=1e-6)
    sizes.append(float(pasted.mean()))
  # The same box for the whole batch, of varying size from batch to batch.
  assert len(set(sizes)) > 10 and 0.1 < np.mean(sizes) < 0.6, sizes


def test_mixup_blends_whole_images_with_one_weight():
  examples, labels = _constant_examples()
  mixed, soft = (x.numpy() for x in mixing.mixup(examples, labels, CLASSES, 0.4, _seed(0)))
  weight = soft[0, 0]
  assert 0 < weight < 1
  neighbour = np.roll(np.arange(BATCH), 1)
  want = weight * np.arange(BATCH) + (1 - weight) * neighbour
  np.testing.assert_allclose(mixed[:, 0, 0, 0], want, rtol=1e-6)
  assert np.all(mixed == mixed[:, :1, :1, :1])


@pytest.mark.parametrize('cutmix_prob', [0.0, 0.3, 1.0])
def test_with_both_a_batch_takes_cutmix_with_cutmix_prob(cutmix_prob):
  examples, labels = _constant_examples()
  draws = 200
  cutmixed = 0
  for i in range(draws):
    mixed, _ = mixing.mix(examples, labels, CLASSES, 0.8, 1.0, cutmix_prob, _seed(i))
    values = np.unique(mixed.numpy()[1])
    cutmixed += bool(np.all(np.isin(values, [0.0, 1.0])))  # Copied pixels: CutMix.
  share = cutmixed / draws
  print(f'cutmix_prob {cutmix_prob}: {cutmixed} of {draws} batches took CutMix')
  assert abs(share - cutmix_prob) < 0.1


def _build(**overrides):
  config = images.default_config()
  config.update(overrides)
  return images.build(config, process_index=0, process_count=1)


def test_cutmix_through_the_pipeline_is_soft_labels_and_reproducible():
  first = next(_build(cutmix_alpha=1.0).train_batches(batch_size=64, seed=0))
  again = next(_build(cutmix_alpha=1.0).train_batches(batch_size=64, seed=0))
  labels = first['label']
  assert labels.shape == (64, 10) and labels.dtype == np.float32
  np.testing.assert_allclose(labels.sum(axis=1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(first['image'], again['image'])
  # Pixels are copied, not blended: every value is one the normalization gives a pixel level.
  plain = next(_build().train_batches(batch_size=64, seed=0))['image']
  assert np.isin(first['image'], plain).all()
  assert not np.array_equal(first['image'], plain)


@pytest.mark.parametrize('overrides, message', [
    ({'cutmix_prob': 0.3}, 'config.data.cutmix_prob=0.3 chooses between mixup and CutMix, but '
                           'mixup_alpha=0.0 and cutmix_alpha=0.0: set both > 0, or leave '
                           'cutmix_prob out.'),
    ({'cutmix_alpha': -1.0}, "cutmix_alpha=-1.0 (expected >= 0)"),
    ({'cutmix_alpha': 1.0, 'mixup_alpha': 0.8, 'cutmix_prob': 1.5},
     'cutmix_prob=1.5 (expected in [0, 1])'),
])
def test_mixing_settings_that_do_not_fit_are_one_line_errors(overrides, message):
  with pytest.raises(errors.ConfigError) as e:
    _build(**overrides)
  assert message in str(e.value) and '\n' not in str(e.value)
