"""vit_jax.weights.storage: .npz, .safetensors and orbax files, exact and all or nothing."""

import os

import numpy as np
import pytest
from weights_helpers import MODELS, _assert_trees_equal, _flat, _random_params, _shapes

from vit_jax import convert, weights


@pytest.mark.parametrize('name', MODELS)
def test_npz_round_trip_is_exact(name, tmp_path):
  params = _random_params(name)
  path = tmp_path / 'params.npz'
  weights.save_npz(path, params)

  with np.load(path) as archive:  # The file uses the published '/'-joined keys.
    assert set(archive.files) == set(_flat(params))
  _assert_trees_equal(weights.load_npz(path), params)
  _assert_trees_equal(weights.load_pretrained(path, _shapes(name)), params)
  wrapped = weights.load_pretrained(str(path), {'params': _shapes(name)})
  _assert_trees_equal(wrapped, {'params': params})


@pytest.mark.parametrize('name', MODELS)
def test_orbax_round_trip_is_exact(name, tmp_path):
  params = _random_params(name)
  workdir = tmp_path / 'workdir'
  weights.write_orbax(str(workdir), _flat(params))
  _assert_trees_equal(weights.read_orbax(str(workdir)), params)
  with pytest.raises(FileExistsError, match='--overwrite'):
    weights.write_orbax(str(workdir), _flat(params))
  # The CLI goes orbax -> npz -> orbax, exactly.
  assert convert.main([str(workdir), str(tmp_path / 'p.npz')]) == 0
  assert convert.main([str(tmp_path / 'p.npz'), str(tmp_path / 'again')]) == 0
  _assert_trees_equal(weights.read_orbax(str(tmp_path / 'again')), params)


def test_corrupt_files_are_clear_errors(tmp_path):
  good = tmp_path / 'good.npz'
  weights.save_npz(good, _random_params('ViT-testing'))
  data = good.read_bytes()
  truncated = tmp_path / 'truncated.npz'
  truncated.write_bytes(data[:len(data) // 2])
  garbage = tmp_path / 'garbage.npz'
  garbage.write_bytes(b'not a checkpoint' * 10)

  for path in (truncated, garbage):
    with pytest.raises(ValueError, match=f'Cannot read checkpoint {path}.*corrupt'):
      weights.load_npz(path)
  # Not numpy's guess that unknown bytes are a pickle, to be loaded unsafely if trusted.
  with pytest.raises(ValueError) as raised:
    weights.load_npz(garbage)
  assert str(raised.value) == (
      f"Cannot read checkpoint {garbage}: its first bytes are neither a zip archive's (an .npz "
      "is one) nor an .npy file's. The file is truncated or corrupt, or not an .npz; download "
      'or write it again.')
  with pytest.raises(FileNotFoundError, match='missing.npz'):
    weights.load_npz(tmp_path / 'missing.npz')

  timm_file = tmp_path / 'model.safetensors'
  weights.save_safetensors(timm_file, weights.to_timm(_random_params('ViT-testing')))
  timm_data = timm_file.read_bytes()
  timm_file.write_bytes(timm_data[:len(timm_data) - 100])
  with pytest.raises(ValueError, match=f'Cannot read checkpoint {timm_file}.*corrupt'):
    weights.load_safetensors(timm_file)


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path, monkeypatch):
  path = tmp_path / 'params.npz'
  params = _random_params('ViT-testing')
  weights.save_npz(path, params)
  original = path.read_bytes()

  with pytest.raises(FileExistsError, match='overwrite'):
    weights.save_npz(path, _random_params('DeiT-testing'))
  assert path.read_bytes() == original

  def crash_half_way(file, **arrays):
    file.write(b'PK\x03\x04 half a file')
    raise KeyboardInterrupt  # E.g. the job is killed while writing.

  monkeypatch.setattr(np, 'savez', crash_half_way)
  with pytest.raises(KeyboardInterrupt):
    weights.save_npz(path, params, overwrite=True)
  with pytest.raises(KeyboardInterrupt):
    weights.save_npz(tmp_path / 'new.npz', params)
  monkeypatch.undo()
  assert path.read_bytes() == original
  assert sorted(os.listdir(tmp_path)) == ['params.npz']  # No half file, no temp file.

  weights.save_npz(path, _random_params('DeiT-testing'), overwrite=True)
  assert 'dist' in weights.load_npz(path)
