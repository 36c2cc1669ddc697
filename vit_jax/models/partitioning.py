"""Logical axis names on parameters, which say how tensor parallelism splits them.

Modules wrap their initialisers: `logical(nn.initializers.zeros, ('heads', 'head_dim'))`.
Inside `with boxed():` (what the trainer does when it works out shardings) such
parameters come out of `init` as flax `nn.LogicallyPartitioned` boxes carrying the
names, which `nn.get_partition_spec` reads and `vit_jax.train.mesh` maps to mesh axes.
Everywhere else they are plain arrays, so `model.init(...)['params']` is a plain tree.
"""

import contextlib
import contextvars
from typing import Callable, Iterator

import flax.linen as nn

_BOXED = contextvars.ContextVar('vit_jax_boxed_axes', default=False)


@contextlib.contextmanager
def boxed() -> Iterator[None]:
  """Within this block, annotated parameters are initialised as LogicallyPartitioned."""
  token = _BOXED.set(True)
  try:
    yield
  finally:
    _BOXED.reset(token)


def logical(init: Callable, names: tuple[str, ...]) -> Callable:
  """`init`, whose result is boxed with the logical axis `names` inside `boxed()`."""
  def initializer(*args, **kwargs):
    value = init(*args, **kwargs)
    return nn.LogicallyPartitioned(value, names) if _BOXED.get() else value
  return initializer
