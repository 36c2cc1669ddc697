"""Random erasing (vit_jax.data.erasing): timm's rectangles of N(0, 1) noise, and through the
train pipeline."""

import numpy as np
import pytest

from vit_jax import errors
from vit_jax.data import erasing, images
from vit_jax.data.tf_cpu import tf

FILL = 7.0  # No noise value equals it: a changed pixel is an erased one.


def _erased(probability, batch=400, height=32, width=24, seed=(3, 4)):
  pictures = tf.fill([batch, height, width, 3], FILL)
  out = erasing.random_erasing(pictures, probability, tf.constant(seed, tf.int64)).numpy()
  return out, out != FILL


def test_each_image_gets_one_rectangle_of_timms_sizes_filled_with_standard_normal_noise():
  out, changed = _erased(1.0)
  assert (changed.all(axis=3) == changed.any(axis=3)).all()  # Every channel of a pixel.
  changed = changed[..., 0]
  areas, aspects, edges = [], [], set()
  for mask in changed:
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    assert rows.size and cols.size, 'an image was not erased'
    height, width = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
    assert mask.sum() == height * width  # One solid rectangle.
    assert np.array_equal(rows, np.arange(rows[0], rows[-1] + 1))
    assert height < 32 and width < 24  # Smaller than the image on both sides.
    areas.append(height * width / (32 * 24))
    aspects.append(height / width)
    edges |= {name for name, touches in [('top', rows[0] == 0), ('bottom', rows[-1] == 31),
                                         ('left', cols[0] == 0), ('right', cols[-1] == 23)]
              if touches}
  # Sides are rounded from a 2%-1/3 area and a 0.3-3.3 aspect ratio.
  assert 0.01 < min(areas) < 0.04 and 0.25 < max(areas) < 0.34
  assert 0.2 < min(aspects) < 0.45 and 2.3 < max(aspects) < 4.5
  assert edges == {'top', 'bottom', 'left', 'right'}  # Every position, edges included.
  noise = out[changed]
  assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1) < 0.02
  assert (out[~changed] == FILL).all()


def test_the_share_of_erased_images_is_the_probability_and_the_seed_decides_which():
  _, changed = _erased(0.25, batch=2000, height=16, width=16)
  share = changed.any(axis=(1, 2, 3)).mean()
  assert 0.21 < share < 0.29  # 0.25 +- 4 standard deviations of 2,000 draws.
  _, again = _erased(0.25, batch=2000, height=16, width=16)
  _, other = _erased(0.25, batch=2000, height=16, width=16, seed=(3, 5))
  np.testing.assert_array_equal(changed, again)
  assert not np.array_equal(changed, other)
  assert not _erased(0.0)[1].any()


def _build(**overrides):
  config = images.default_config()
  config.update(overrides)
  return images.build(config, process_index=0, process_count=1)


def test_the_pipeline_erases_train_batches_reproducibly_and_never_eval_batches():
  plain = next(_build().train_batches(batch_size=64, seed=0))['image']
  first = next(_build(random_erasing_prob=0.5).train_batches(batch_size=64, seed=0))['image']
  again = next(_build(random_erasing_prob=0.5).train_batches(batch_size=64, seed=0))['image']
  np.testing.assert_array_equal(first, again)
  erased = (first != plain).any(axis=(1, 2, 3))
  assert 10 < erased.sum() < 54  # About half of 64.
  np.testing.assert_array_equal(first[~erased], plain[~erased])
  # Evaluation sees the images as they are.
  plain_eval = next(iter(_build().eval_batches(batch_size=32)))['image']
  erasing_eval = next(iter(_build(random_erasing_prob=1.0).eval_batches(batch_size=32)))['image']
  np.testing.assert_array_equal(plain_eval, erasing_eval)


@pytest.mark.parametrize('probability', [-0.1, 1.5])
def test_a_probability_outside_0_1_is_a_one_line_error(probability):
  with pytest.raises(errors.ConfigError) as e:
    _build(random_erasing_prob=probability)
  assert f'random_erasing_prob={probability} (expected in [0, 1])' in str(e.value)
  assert '\n' not in str(e.value)


def _rectangle_statistics(changed):
  """(B, H, W) erased masks -> (B, 4): erased or not, area share, log(height / width), and the
  rectangle's centre row as a share of the image's height (NaN where not erased)."""
  height, width = changed.shape[1:]
  rows, cols = changed.any(axis=2), changed.any(axis=1)
  heights, widths = rows.sum(axis=1), cols.sum(axis=1)
  erased = heights > 0
  first_row = np.where(erased, rows.argmax(axis=1), 0)
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.stack([erased, np.where(erased, heights * widths / (height * width), np.nan),
                     np.where(erased, np.log(heights / widths), np.nan),
                     np.where(erased, (first_row + heights / 2) / height, np.nan)], axis=1)


def test_the_rectangles_are_distributed_as_timms():
  torch = pytest.importorskip('torch')
  pytest.importorskip('timm')
  import random  # pylint: disable=g-import-not-at-top
  from timm.data.random_erasing import RandomErasing  # pylint: disable=g-import-not-at-top
  batch, height, width = 3000, 32, 24
  random.seed(0)
  torch.manual_seed(0)

  def timms(probability):
    erase = RandomErasing(probability=probability, mode='pixel', device='cpu')
    return erase(torch.full((batch, 3, height, width), FILL)).numpy()[:, 0] != FILL

  shares = [_rectangle_statistics(timms(0.25))[:, 0].mean(),
            _rectangle_statistics(_erased(0.25, batch, height, width)[1][..., 0])[:, 0].mean()]
  assert abs(shares[0] - shares[1]) < 0.035, shares  # 0.25 each; 3 standard errors apart.
  theirs = _rectangle_statistics(timms(1.0))
  ours = _rectangle_statistics(_erased(1.0, batch, height, width)[1][..., 0])
  assert theirs[:, 0].all() and ours[:, 0].all()
  # Two-sample Kolmogorov-Smirnov distance: under 0.07 at 3,000 draws each (p > 0.001).
  for column, name in [(1, 'area share'), (2, 'log aspect'), (3, 'centre row')]:
    a, b = np.sort(theirs[:, column]), np.sort(ours[:, column])
    points = np.union1d(a, b)
    distance = np.abs(np.searchsorted(a, points, side='right') / a.size
                      - np.searchsorted(b, points, side='right') / b.size).max()
    print(f'{name}: mean timm {a.mean():.3f}, ours {b.mean():.3f}; KS distance {distance:.3f}')
    assert distance < 0.07, (name, distance)
