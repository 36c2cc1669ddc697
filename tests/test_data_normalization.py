"""Pixel normalization (vit_jax.data.normalization) and the pipeline's use of it."""

import numpy as np
import pytest

from vit_jax import errors
from vit_jax.data import images, normalization

PIXELS = np.arange(256, dtype=np.float32)


def test_the_default_is_the_published_vits_unit_range():
  scale, offset = normalization.affine(0.5, 0.5, 3)
  assert scale.shape == offset.shape == (3,) and scale.dtype == np.float32
  np.testing.assert_allclose(PIXELS[:, None] * scale + offset,
                             np.repeat(PIXELS[:, None] / 127.5 - 1, 3, axis=1), atol=1e-6)
  assert (0 * scale + offset).tolist() == [-1.0] * 3


def test_imagenet_statistics_per_channel():
  scale, offset = normalization.affine(normalization.IMAGENET_MEAN, normalization.IMAGENET_STD, 3)
  want = (PIXELS[:, None] / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224,
                                                                              0.225])
  np.testing.assert_allclose(PIXELS[:, None] * scale + offset, want, rtol=1e-6, atol=1e-6)
  back = normalization.to_unit_interval(PIXELS[:, None] * scale + offset, scale, offset)
  np.testing.assert_allclose(back, np.repeat(PIXELS[:, None] / 255, 3, axis=1), atol=1e-6)


def test_one_value_serves_every_channel_and_equal_values_serve_one_channel():
  np.testing.assert_array_equal(normalization.affine((0.4,), (0.2,), 3)[1], [-2.0] * 3)
  np.testing.assert_array_equal(normalization.affine((0.4,) * 3, (0.2,) * 3, 1)[1], [-2.0])


@pytest.mark.parametrize('mean, std, channels, message', [
    ((0.485, 0.456, 0.406), 0.5, 1,
     'config.data.pixel_mean=(0.485, 0.456, 0.406) has 3 values for 1 channel: give one per '
     'channel or one for all, e.g. config.data.pixel_mean=(0.449,).'),
    ((0.4, 0.5), 0.5, 3, 'config.data.pixel_mean=(0.4, 0.5) has 2 values for 3 channels'),
    (0.5, (0.0,), 3, 'config.data.pixel_std=(0.0,): expected values in (0, 1] (fractions of 255'),
    ((124, 116, 104), 0.5, 3, 'config.data.pixel_mean=(124, 116, 104): expected values in [0, 1]'),
    (('a',), 0.5, 3, "config.data.pixel_mean=('a',): expected numbers"),
])
def test_statistics_that_do_not_fit_are_one_line_errors(mean, std, channels, message):
  with pytest.raises(errors.ConfigError) as e:
    normalization.affine(mean, std, channels)
  assert message in str(e.value) and '\n' not in str(e.value)


def _build(**overrides):
  config = images.default_config()
  config.update(overrides)
  return images.build(config, process_index=0, process_count=1)


@pytest.mark.parametrize('stats', ['imagenet', 'one_value'])
def test_train_and_eval_batches_take_the_configs_statistics(stats):
  mean, std = ((normalization.IMAGENET_MEAN, normalization.IMAGENET_STD) if stats == 'imagenet'
               else ((0.25,), (0.125,)))
  normalized = _build(pixel_mean=mean, pixel_std=std)
  default = _build()
  want_mean, want_std = np.broadcast_to(mean, 3), np.broadcast_to(std, 3)
  for name, batches in (('eval', lambda d: d.eval_batches(360)),
                        ('train', lambda d: d.train_batches(64, seed=3))):
    got, unit = next(batches(normalized))['image'], next(batches(default))['image']
    pixels = (unit + 1) / 2  # The same examples in [0, 1].
    np.testing.assert_allclose(got, (pixels - want_mean) / want_std, atol=2e-5, err_msg=name)
    # Digits hold black (0) and white (255) pixels: the extremes of each channel.
    np.testing.assert_allclose(got.min(axis=(0, 1, 2)), -want_mean / want_std, rtol=1e-6)
    np.testing.assert_allclose(got.max(axis=(0, 1, 2)), (1 - want_mean) / want_std, rtol=1e-6)


def test_image_files_take_the_configs_statistics(tmp_path):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.random.RandomState(0).randint(0, 256, (8, 8, 3)).astype(np.uint8)
  path = str(tmp_path / 'a.png')
  Image.fromarray(pixels).save(path)
  got = images.load_files([path], {'pixel_mean': normalization.IMAGENET_MEAN,
                                   'pixel_std': normalization.IMAGENET_STD})
  want = (pixels / 255 - np.array(normalization.IMAGENET_MEAN)) / np.array(
      normalization.IMAGENET_STD)
  np.testing.assert_allclose(got[0], want, atol=2e-5)
