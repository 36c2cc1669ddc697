"""The backend a model is traced for: this machine's, or the one `target_backend` names.

The kernel 'auto' attention becomes (`attention.resolve_attention_impl`) depends on it,
at trace time. Naming another backend lets a CPU compile the model a GPU would run
(`python -m vit_jax.benchmark --compile-for h200`).
"""

import contextlib
import contextvars

import jax

# The backend models are traced for inside `target_backend`; None: `jax.default_backend()`.
_TARGET_BACKEND = contextvars.ContextVar('vit_jax_target_backend', default=None)


def traced_backend() -> str:
  """The backend models traced here are for: the one `target_backend` sets, else
  `jax.default_backend()`."""
  return _TARGET_BACKEND.get() or jax.default_backend()


@contextlib.contextmanager
def target_backend(backend: str):
  """Models traced inside are traced for `backend` ('gpu', ...), not this machine's: their
  'auto' attention kernels. For compiling for a device that is not here."""
  token = _TARGET_BACKEND.set(backend)
  try:
    yield
  finally:
    _TARGET_BACKEND.reset(token)
