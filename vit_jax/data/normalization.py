"""Pixel normalization: uint8 pixels p -> (p / 255 - mean) / std, per channel.

Google's ViT, BiT and timm's augreg ViTs take mean = std = 0.5 (inputs in [-1, 1], this
package's default); DeiT and timm's ImageNet-trained ResNets take ImageNet's statistics,
mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225). A model sees good inputs only with
the statistics it was trained with: `config.data.pixel_mean` and `config.data.pixel_std`.

One value per channel, or one value for every channel. No TensorFlow here: the TF
pipeline, the exported models' jnp preprocessing and the plots all take `affine`'s numbers.
"""

import numpy as np

from vit_jax import errors

INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _spelled(name: str, values, flag: bool) -> str:
  """NAME=(a, b, c) as a config spells it, or NAME a,b,c as a command-line flag."""
  values = tuple(values) if isinstance(values, (list, tuple, np.ndarray)) else (values,)
  if flag:
    return f'{name} {",".join(str(v) for v in values)}'
  return f'{name}=({", ".join(repr(v) for v in values)}{"," * (len(values) == 1)})'


def _per_channel(values, name: str, channels: int, low_open: bool, flag: bool) -> np.ndarray:
  """`values` as float64 (channels,); a one-line ConfigError if they do not fit."""
  shown = _spelled(name, values, flag)
  try:
    array = np.asarray(values, np.float64).reshape(-1)
  except (TypeError, ValueError):
    raise errors.ConfigError(f'{shown}: expected numbers, e.g. '
                             f'{_spelled(name, INCEPTION_MEAN, flag)}.') from None
  in_range = (array > 0) if low_open else (array >= 0)
  if not np.all(in_range & (array <= 1)):
    raise errors.ConfigError(f'{shown}: expected values in {"(" if low_open else "["}0, 1] '
                             '(fractions of 255, as timm gives them).')
  if array.size == channels:
    return array
  if array.size >= 1 and np.all(array == array[0]):
    return np.full(channels, array[0])
  example = ((round(float(array.mean()), 3),) if channels == 1 and array.size
             else INCEPTION_MEAN[:1] * channels)
  raise errors.ConfigError(
      f'{shown} has {array.size} values for {channels} channel{"s" * (channels > 1)}: give '
      f'one per channel or one for all, e.g. {_spelled(name, example, flag)}.')


def statistics(mean, std, channels: int, where: str = 'config.data.', flags: bool = False):
  """(mean, std), each float64 (channels,) in units of 0..1 pixels; checked.

  Errors name them `where`pixel_mean=(...) (a config's fields), or with `flags`, as the
  command-line flags --pixel-mean and --pixel-std.
  """
  names = ('--pixel-mean', '--pixel-std') if flags else (f'{where}pixel_mean', f'{where}pixel_std')
  return (_per_channel(mean, names[0], channels, low_open=False, flag=flags),
          _per_channel(std, names[1], channels, low_open=True, flag=flags))


def affine(mean, std, channels: int, where: str = 'config.data.'):
  """(scale, offset), float32 (channels,): a uint8 pixel p becomes p * scale + offset."""
  mean, std = statistics(mean, std, channels, where)
  return (1 / (255 * std)).astype(np.float32), (-mean / std).astype(np.float32)


def of_config(data_config) -> tuple[np.ndarray, np.ndarray]:
  """`affine` of a data config's pixel_mean, pixel_std and channels."""
  return affine(data_config.pixel_mean, data_config.pixel_std, data_config.channels)


def to_unit_interval(images: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
  """Normalized images (..., C) back to [0, 1] pixels (for display)."""
  return (np.asarray(images, np.float32) - offset) / scale / 255
