"""Stored parameters of another model's shape are refused in one line naming the first."""

import numpy as np
import pytest

from vit_jax import errors
from vit_jax.train import shapes


def test_the_mismatched_and_missing_parameters_are_named():
  expected = {'head': {'kernel': np.zeros((8, 10)), 'bias': np.zeros(10)},
              'embedding': {'kernel': np.zeros((4, 4, 3, 8))}}
  stored = {'head': {'kernel': np.zeros((8, 1000)), 'bias': np.zeros(1000)},
            'extra': {'scale': np.zeros(8)}}
  with pytest.raises(errors.ConfigError) as raised:
    shapes.check_shapes(stored, expected, 'The checkpoint at step 3 in /w')
  assert str(raised.value) == (
      'The checkpoint at step 3 in /w was written by a model of another shape (4 mismatched '
      'parameters, first: embedding/kernel: checkpoint missing, model (4, 4, 3, 8); '
      'extra/scale: checkpoint (8,), model missing; head/bias: checkpoint (1000,), model (10,)). '
      'Use a new --workdir, or the config that wrote it.')


def test_equal_shapes_pass_whatever_the_leaves_are():
  shapes.check_shapes({'a': {'kernel': np.zeros((2, 3))}},
                      {'a': {'kernel': np.zeros((2, 3), np.float16)}}, 'it')
