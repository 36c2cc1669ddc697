"""The backend models are traced for: this machine's unless `target_backend` names another."""

import threading

import jax
import pytest

from vit_jax.models import backend


def test_traced_backend_is_this_machines_outside_target_backend():
  assert backend.traced_backend() == jax.default_backend()


def test_target_backend_nests_and_restores_even_after_an_error():
  with backend.target_backend('gpu'):
    assert backend.traced_backend() == 'gpu'
    with backend.target_backend('tpu'):
      assert backend.traced_backend() == 'tpu'
    assert backend.traced_backend() == 'gpu'
  assert backend.traced_backend() == jax.default_backend()
  with pytest.raises(RuntimeError):
    with backend.target_backend('gpu'):
      raise RuntimeError('a failed compile')
  assert backend.traced_backend() == jax.default_backend()


def test_target_backend_is_per_thread():
  """One thread compiling for a GPU does not change what another thread traces for."""
  seen = {}
  inside, checked = threading.Event(), threading.Event()

  def compile_for_gpu():
    with backend.target_backend('gpu'):
      inside.set()
      checked.wait(10)

  thread = threading.Thread(target=compile_for_gpu)
  thread.start()
  inside.wait(10)
  seen['other thread'] = backend.traced_backend()
  checked.set()
  thread.join()
  assert seen == {'other thread': jax.default_backend()}
