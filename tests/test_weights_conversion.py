"""vit_jax.weights.conversion and its command line, `python -m vit_jax.convert`."""

import os
import subprocess
import sys

import numpy as np
from weights_helpers import _assert_trees_equal, _flat, _per_type_numbering, _random_params

from vit_jax import convert, weights


def test_cli_converts_both_ways(tmp_path, capsys):
  for name in ('R+ViT-testing', 'DeiT-testing'):
    params = _random_params(name)
    npz, timm_file, back = (tmp_path / f'{name}{ext}'
                            for ext in ('.npz', '.safetensors', '.back.npz'))
    weights.save_npz(npz, _per_type_numbering(_flat(params)))  # Normalised on the way.

    assert convert.main([str(npz), str(timm_file)]) == 0
    assert 'note:' not in capsys.readouterr().out
    assert convert.main([str(timm_file), str(back), '--model', name]) == 0
    out = capsys.readouterr().out
    assert f'Wrote {back}' in out
    # Facebook's DeiT weights come from timm: the statistics they expect are said.
    assert (("note: Facebook's DeiT weights expect ImageNet's pixel statistics" in out)
            == name.startswith('DeiT')), out

    np.testing.assert_equal(weights.load_safetensors(timm_file), weights.to_timm(params))
    _assert_trees_equal(weights.load_npz(back), params)


def test_cli_refuses_existing_destination(tmp_path, capsys):
  src, dst = tmp_path / 'src.npz', tmp_path / 'dst.safetensors'
  weights.save_npz(src, _random_params('ViT-testing'))
  dst.write_bytes(b'precious')

  assert convert.main([str(src), str(dst)]) == 1
  assert '--overwrite' in capsys.readouterr().err
  assert dst.read_bytes() == b'precious'

  assert convert.main([str(src), str(dst), '--overwrite']) == 0
  assert 'blocks.0.attn.qkv.weight' in weights.load_safetensors(dst)


def test_cli_overwrite_replaces_an_earlier_conversion_and_nothing_else(tmp_path, capsys,
                                                                       monkeypatch):
  src = tmp_path / 'src.npz'
  weights.save_npz(src, _random_params('ViT-testing'))
  orbax_dir = tmp_path / 'orbax'
  assert convert.main([str(src), str(orbax_dir)]) == 0
  assert convert.main([str(src), str(orbax_dir), '--overwrite']) == 0
  assert os.listdir(orbax_dir) == ['checkpoints']
  workdir = tmp_path / 'workdir'  # A training run's workdir is more than its checkpoints.
  assert convert.main([str(src), str(workdir)]) == 0
  (workdir / 'config.json').write_text('{}')
  capsys.readouterr()
  assert convert.main([str(src), str(workdir), '--overwrite']) == 1
  assert 'and {} is not one; remove it yourself'.format(workdir) in capsys.readouterr().err
  assert sorted(os.listdir(workdir)) == ['checkpoints', 'config.json']
  monkeypatch.chdir(workdir)
  assert convert.main([str(src), '.', '--overwrite']) == 1
  assert 'would replace ., the current directory' in capsys.readouterr().err
  assert sorted(os.listdir(workdir)) == ['checkpoints', 'config.json']


def test_cli_corrupt_source_leaves_destination_alone(tmp_path, capsys):
  src = tmp_path / 'src.npz'
  weights.save_npz(src, _random_params('ViT-testing'))
  src.write_bytes(src.read_bytes()[:1000])
  existing, absent = tmp_path / 'existing.safetensors', tmp_path / 'absent.safetensors'
  existing.write_bytes(b'precious')

  assert convert.main([str(src), str(existing), '--overwrite']) == 1
  assert convert.main([str(src), str(absent)]) == 1
  assert 'corrupt' in capsys.readouterr().err
  assert existing.read_bytes() == b'precious'
  assert sorted(os.listdir(tmp_path)) == ['existing.safetensors', 'src.npz']


def test_cli_print_lists_names_and_shapes(tmp_path, capsys):
  src, timm_file = tmp_path / 'src.npz', tmp_path / 'src.safetensors'
  params = _random_params('DeiT-testing')
  weights.save_npz(src, params)
  weights.save_safetensors(timm_file, weights.to_timm(params))

  assert convert.main(['--print', str(src)]) == 0
  out = capsys.readouterr().out
  assert 'Transformer/posembed_input/pos_embedding' in out and '(1, 18, 32)' in out
  assert f'{len(_flat(params))} arrays' in out

  assert convert.main(['--print', str(timm_file)]) == 0
  out = capsys.readouterr().out
  assert 'blocks.1.attn.qkv.weight' in out and '(96, 32)' in out


def test_cli_errors(tmp_path, capsys):
  npz, timm_file = tmp_path / 'vit.npz', tmp_path / 'vit.safetensors'
  params = _random_params('ViT-testing')
  weights.save_npz(npz, params)
  weights.save_safetensors(timm_file, weights.to_timm(params))
  orbax_dir = tmp_path / 'orbax'
  orbax_dir.mkdir()

  cases = [([str(orbax_dir), str(tmp_path / 'x.npz')], 'not a vit_jax workdir'),
           ([str(npz), str(orbax_dir)], 'already exists; pass --overwrite'),
           ([str(npz), str(tmp_path / 'x.pt')], 'extension'),
           ([str(tmp_path / 'x.pth'), str(npz)], "x.pth is a PyTorch pickle; save its state dict "
                                                 'as .safetensors first: python -c'),
           ([str(tmp_path / 'missing'), str(tmp_path / 'x.npz')], 'missing does not exist.'),
           ([str(timm_file), str(tmp_path / 'y.npz')], '--model'),
           ([str(npz), str(tmp_path / 'z.npz'), '--model', 'DeiT-testing'],
            'not a DeiT-testing checkpoint')]
  for argv, message in cases:
    assert convert.main(argv) == 1, argv
    assert message in capsys.readouterr().err, argv
  assert sorted(os.listdir(tmp_path)) == ['orbax', 'vit.npz', 'vit.safetensors']


def test_cli_runs_as_module(tmp_path):
  src = tmp_path / 'src.npz'
  weights.save_npz(src, _random_params('ViT-testing'))
  result = subprocess.run([sys.executable, '-m', 'vit_jax.convert', '--print', str(src)],
                          capture_output=True, text=True, check=False, timeout=120)
  assert result.returncode == 0, result.stderr
  assert 'head/kernel' in result.stdout
