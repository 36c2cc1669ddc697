"""Checking a data config: its keys against the defaults, its values against their ranges.

  checks = checks.Checks(defaults, config, 'data config')  # Unknown keys raise here.
  checks.require(checks.config.image_size > 0, 'image_size', 'an int > 0')
  config = checks.result()  # Every problem in one ConfigError.
"""

import ml_collections
import numpy as np

from vit_jax import errors


def is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Checks:
  """The defaults updated with a config; collects the values that are out of range."""

  def __init__(self, defaults: ml_collections.ConfigDict, config, what: str):
    unknown = sorted(set(config.keys()) - set(defaults.keys()))
    if unknown:
      raise errors.ConfigError(f'Unknown {what} keys {unknown}; known keys: '
                               f'{sorted(defaults.keys())}.')
    defaults.update(dict(config.items()))
    self.config, self.what, self.problems = defaults, what, []

  def require(self, ok: bool, key: str, expected: str):
    if not ok:
      self.problems.append(f'{key}={self.config[key]!r} (expected {expected})')

  def require_int(self, key: str, minimum: int, expected: str = ''):
    value = self.config[key]
    self.require(is_int(value) and value >= minimum, key, expected or f'an int >= {minimum}')

  def result(self) -> ml_collections.ConfigDict:
    """The checked config; a ConfigError naming every problem if there are any."""
    if self.problems:
      raise errors.ConfigError(f'Invalid {self.what}: ' + '; '.join(self.problems) + '.')
    return self.config
