"""Checkpoints: published .npz layout, fitting to a model, timm conversion, the CLI."""

import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import checkpoint
from vit_jax import convert
from vit_jax.models import get_model, model_config, stack_layers

MODELS = ('ViT-testing', 'R+ViT-testing', 'DeiT-testing')
NUM_CLASSES = 10
SIZE = 16  # Image side: a 4x4 patch grid for ViT/DeiT-testing, 2x2 for R+ViT-testing.
POSEMB = 'Transformer/posembed_input/pos_embedding'


@functools.cache
def _model(name, num_classes=NUM_CLASSES, **overrides):
  return get_model(name, num_classes=num_classes, **overrides)


@functools.cache
def _shapes(name, num_classes=NUM_CLASSES, size=SIZE, **overrides):
  """Parameter shapes (jax.ShapeDtypeStruct leaves) of a model at `size` pixels."""
  model = _model(name, num_classes, **overrides)
  images = jnp.zeros((1, size, size, 3))
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))['params']


@functools.cache
def _random_params(name, num_classes=NUM_CLASSES, seed=0, size=SIZE, **overrides):
  """Non-zero params (the real head is zero-initialised, which would hide mistakes)."""
  rng = np.random.default_rng([seed, sum(map(ord, name))])
  return jax.tree.map(lambda s: rng.normal(0.0, 0.2, s.shape).astype(np.float32),
                      _shapes(name, num_classes, size, **overrides))


@functools.cache
def _apply_fn(name, num_classes=NUM_CLASSES, **overrides):
  model = _model(name, num_classes, **overrides)
  return jax.jit(lambda params, images: model.apply({'params': params}, images))


def _images(size=SIZE):
  return np.random.default_rng(7).normal(size=(2, size, size, 3)).astype(np.float32)


def _logits(name, params, size=SIZE, **overrides):
  return np.asarray(_apply_fn(name, **overrides)(params, _images(size)))


def _flat(params):
  return checkpoint.flatten_params(params)


def _assert_trees_equal(actual, expected):
  """Same structure, and bitwise-equal float32 leaves."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual),
                          jax.tree.leaves(expected), strict=True):
    assert isinstance(a, np.ndarray) and a.dtype == np.float32, path
    np.testing.assert_array_equal(a, np.asarray(b), err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------
# Exact round trips.


@pytest.mark.parametrize('name', MODELS)
def test_npz_round_trip_is_exact(name, tmp_path):
  params = _random_params(name)
  path = tmp_path / 'params.npz'
  checkpoint.save_npz(path, params)

  with np.load(path) as archive:  # The file uses the published '/'-joined keys.
    assert set(archive.files) == set(_flat(params))
  _assert_trees_equal(checkpoint.load_npz(path), params)
  _assert_trees_equal(checkpoint.load_pretrained(path, _shapes(name)), params)
  wrapped = checkpoint.load_pretrained(str(path), {'params': _shapes(name)})
  _assert_trees_equal(wrapped, {'params': params})


@pytest.mark.parametrize('name', MODELS)
def test_orbax_round_trip_is_exact(name, tmp_path):
  params = _random_params(name)
  workdir = tmp_path / 'workdir'
  convert.write_orbax(str(workdir), _flat(params))
  _assert_trees_equal(convert.read_orbax(str(workdir)), params)
  with pytest.raises(FileExistsError, match='--overwrite'):
    convert.write_orbax(str(workdir), _flat(params))
  # The CLI goes orbax -> npz -> orbax, exactly.
  assert convert.main([str(workdir), str(tmp_path / 'p.npz')]) == 0
  assert convert.main([str(tmp_path / 'p.npz'), str(tmp_path / 'again')]) == 0
  _assert_trees_equal(convert.read_orbax(str(tmp_path / 'again')), params)


@pytest.mark.parametrize('name', MODELS)
def test_timm_round_trip_is_exact(name, tmp_path):
  params = _random_params(name)
  flat = _flat(params)
  path = tmp_path / 'model.safetensors'
  convert.save_safetensors(path, convert.to_timm(params))
  state_dict = convert.load_safetensors(path)

  attn = 'Transformer/encoderblock_1/MultiHeadDotProductAttention_1/'
  query = flat[attn + 'query/kernel']  # (D, N, H)
  assert state_dict['blocks.1.attn.qkv.weight'].shape == (3 * 32, 32)
  np.testing.assert_array_equal(state_dict['blocks.1.attn.qkv.weight'][:32],
                                query.reshape(32, 32).T)
  np.testing.assert_array_equal(state_dict['blocks.1.attn.proj.weight'],
                                flat[attn + 'out/kernel'].reshape(32, 32).T)
  np.testing.assert_array_equal(state_dict['patch_embed.proj.weight'],
                                flat['embedding/kernel'].transpose(3, 2, 0, 1))
  np.testing.assert_array_equal(state_dict['head.weight'], flat['head/kernel'].T)
  assert state_dict['pos_embed'].shape == flat[POSEMB].shape
  if name == 'DeiT-testing':
    assert {'dist_token', 'head_dist.weight', 'head_dist.bias'} <= set(state_dict)
  if name == 'R+ViT-testing':
    assert state_dict['patch_embed.backbone.stem.conv.weight'].shape == (32, 3, 7, 7)
    assert 'patch_embed.backbone.stages.1.blocks.0.downsample.conv.weight' in state_dict
    assert 'patch_embed.backbone.stages.0.blocks.0.norm3.bias' in state_dict

  _assert_trees_equal(convert.from_timm(state_dict, _shapes(name)), params)


def test_stem_only_hybrid_uses_timm_bare_stem_names():
  params = _random_params('R+ViT-Ti_16', size=32, num_layers=1)  # 32 = stem stride x patch.
  state_dict = convert.to_timm(params)
  assert 'patch_embed.backbone.conv.weight' in state_dict  # As timm's vit_tiny_r_s16_p8.
  assert not any('.stem.' in name for name in state_dict)
  _assert_trees_equal(
      convert.from_timm(state_dict, _shapes('R+ViT-Ti_16', size=32, num_layers=1)), params)


# ----------------------------------------------------------------------------
# Layout variants of the published format.


def _per_type_numbering(flat):
  """What current Flax writes: sub-modules numbered per type inside a block."""
  renames = {'/MultiHeadDotProductAttention_1/': '/MultiHeadDotProductAttention_0/',
             '/LayerNorm_2/': '/LayerNorm_1/', '/MlpBlock_3/': '/MlpBlock_0/'}
  out = {}
  for name, value in flat.items():
    for old, new in renames.items():
      name = name.replace(old, new)
    out[name] = value
  return out


def _groupnorm_quirk(flat):
  """Older hybrid files store GroupNorm scale/bias as (1, 1, 1, C)."""
  def is_groupnorm(name):
    folders = name.split('/')[:-1]
    return bool(folders) and folders[-1].startswith('gn')
  return {name: value.reshape(1, 1, 1, -1) if is_groupnorm(name) else value
          for name, value in flat.items()}


def _stacked(flat):
  stacked = stack_layers(checkpoint.unflatten_params(flat))  # The models' own helper.
  return {name: np.asarray(value) for name, value in _flat(stacked).items()}


VARIANTS = {
    'old_numbering_groupnorm_quirk': ('R+ViT-testing', _groupnorm_quirk,
                                      'block1/unit1/gn1/scale'),
    'per_type_numbering': ('DeiT-testing', _per_type_numbering,
                           'Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel'),
    'stacked': ('ViT-testing', _stacked, 'Transformer/encoderblock/LayerNorm_2/scale'),
    'stacked_per_type_numbering': ('ViT-testing', lambda f: _per_type_numbering(_stacked(f)),
                                   'Transformer/encoderblock/LayerNorm_1/scale'),
}


@pytest.mark.parametrize('variant', VARIANTS)
def test_layout_variants_load_to_the_same_logits(variant, tmp_path):
  name, rewrite, marker = VARIANTS[variant]
  params = _random_params(name)
  variant_flat = rewrite(_flat(params))
  assert marker in variant_flat  # The file really is in the variant layout.
  path = tmp_path / f'{variant}.npz'
  np.savez(path, **variant_flat)

  loaded = checkpoint.load_pretrained(path, _shapes(name))

  _assert_trees_equal(loaded, params)
  np.testing.assert_array_equal(_logits(name, loaded), _logits(name, params))


def test_scanned_model_loads_per_layer_file_and_back(tmp_path):
  params = _random_params('ViT-testing')
  path = tmp_path / 'per_layer.npz'
  checkpoint.save_npz(path, params)
  scanned_shapes = _shapes('ViT-testing', scan_layers=True)

  scanned = checkpoint.load_pretrained(path, scanned_shapes)

  assert jax.tree.structure(scanned) == jax.tree.structure(scanned_shapes)
  assert scanned['Transformer']['encoderblock']['LayerNorm_0']['scale'].shape == (2, 32)
  np.testing.assert_allclose(_logits('ViT-testing', scanned, scan_layers=True),
                             _logits('ViT-testing', params), rtol=1e-5, atol=1e-6)
  # Back to per-layer (and to timm) from the scanned tree.
  _assert_trees_equal(checkpoint.load_pretrained(scanned, _shapes('ViT-testing')), params)
  timm_from_scanned = convert.to_timm(scanned)
  for key, value in convert.to_timm(params).items():
    np.testing.assert_array_equal(timm_from_scanned[key], value)


# ----------------------------------------------------------------------------
# Fitting to another resolution, class count, pre_logits.


@pytest.mark.parametrize('name, num_extra', [('ViT-testing', 1), ('DeiT-testing', 2)])
def test_other_resolution_resizes_position_embedding(name, num_extra, tmp_path):
  params = _random_params(name)
  path = tmp_path / 'params.npz'
  checkpoint.save_npz(path, params)

  loaded = checkpoint.load_pretrained(path, _shapes(name, size=24))  # 4x4 -> 6x6 grid.

  old = params['Transformer']['posembed_input']['pos_embedding']
  new = loaded['Transformer']['posembed_input']['pos_embedding']
  assert new.shape == (1, num_extra + 36, 32)
  np.testing.assert_array_equal(new[:, :num_extra], old[:, :num_extra])
  expected_grid = jax.image.resize(old[0, num_extra:].reshape(4, 4, 32), (6, 6, 32),
                                   method='bilinear', antialias=False)
  np.testing.assert_allclose(new[0, num_extra:].reshape(6, 6, 32), expected_grid,
                             atol=1e-6)
  for key in ('cls', 'embedding', 'head'):  # Everything else is unchanged.
    _assert_trees_equal(loaded[key], params[key])
  _assert_trees_equal(loaded['Transformer']['encoderblock_1'],
                      params['Transformer']['encoderblock_1'])
  logits = _logits(name, loaded, size=24)
  assert logits.shape == (2, NUM_CLASSES) and np.all(np.isfinite(logits))


def test_resize_posemb_identity_and_downsampling():
  posemb = np.random.default_rng(0).normal(size=(1, 1 + 36, 8)).astype(np.float32)
  np.testing.assert_array_equal(checkpoint.resize_posemb(posemb, 1, (6, 6)), posemb)
  small = checkpoint.resize_posemb(posemb, 1, (4, 3))
  expected = jax.image.resize(posemb[0, 1:].reshape(6, 6, 8), (4, 3, 8), method='bilinear',
                              antialias=False)
  np.testing.assert_allclose(small[0, 1:].reshape(4, 3, 8), expected, atol=1e-6)
  with pytest.raises(ValueError, match='not a square grid'):
    checkpoint.resize_posemb(posemb[:, :-1], 1, (4, 4))


def test_head_follows_class_count(tmp_path):
  params = _random_params('ViT-testing')
  path = tmp_path / 'params.npz'
  checkpoint.save_npz(path, params)
  model = _model('ViT-testing', num_classes=5)
  init = jax.jit(model.init)(jax.random.PRNGKey(1), jnp.zeros((1, SIZE, SIZE, 3)))['params']
  assert not np.any(init['head']['kernel'])  # The model's own head is zero-initialised.

  other = checkpoint.load_pretrained(path, init)
  _assert_trees_equal(other['head'], init['head'])
  _assert_trees_equal(other['Transformer'], params['Transformer'])

  features_only = checkpoint.load_pretrained(path, _shapes('ViT-testing', num_classes=0))
  assert 'head' not in features_only  # A model without a head drops the file's.
  _assert_trees_equal(features_only['embedding'], params['embedding'])

  fresh = _random_params('ViT-testing', seed=1)  # Stands in for an initialised model.
  same = checkpoint.load_pretrained(path, fresh)
  _assert_trees_equal(same['head'], params['head'])
  forced = checkpoint.load_pretrained(path, fresh, reinit_head=True)
  _assert_trees_equal(forced['head'], fresh['head'])
  _assert_trees_equal(forced['cls'], params['cls'])


def test_pre_logits_dropped_or_kept(tmp_path):
  with_repr = _random_params('ViT-testing', seed=1, representation_size=32)
  without_repr = _random_params('ViT-testing')
  path = tmp_path / 'with_pre_logits.npz'
  checkpoint.save_npz(path, with_repr)

  # File has pre_logits, model not: dropped; the head (trained on top of it) is re-initialised
  # even though its shape matches.
  loaded = checkpoint.load_pretrained(path, without_repr)
  assert 'pre_logits' not in loaded
  _assert_trees_equal(loaded['head'], without_repr['head'])
  _assert_trees_equal(loaded['Transformer'], with_repr['Transformer'])

  # File lacks pre_logits, model has it: the model's own pre_logits and head are kept.
  path = tmp_path / 'without_pre_logits.npz'
  checkpoint.save_npz(path, without_repr)
  loaded = checkpoint.load_pretrained(path, with_repr)
  _assert_trees_equal(loaded['pre_logits'], with_repr['pre_logits'])
  _assert_trees_equal(loaded['head'], with_repr['head'])
  _assert_trees_equal(loaded['embedding'], without_repr['embedding'])

  # The shapes alone cannot provide a head: a clear error asks for real init params.
  with pytest.raises(ValueError, match='only its shape'):
    checkpoint.load_pretrained(path, _shapes('ViT-testing', representation_size=32))


# ----------------------------------------------------------------------------
# Errors.


def test_other_architecture_lists_mismatches(tmp_path):
  path = tmp_path / 'vit_testing.npz'
  checkpoint.save_npz(path, _random_params('ViT-testing'))

  wider = _shapes('ViT-testing', hidden_size=48, mlp_dim=96)
  with pytest.raises(ValueError, match='file vs model') as error:
    checkpoint.load_pretrained(path, wider)
  message = str(error.value)
  assert str(path) in message
  assert 'embedding/kernel: (4, 4, 3, 32) vs (4, 4, 3, 48)' in message
  assert re.search(r'; and \d+ more\)', message)  # Only the first few are listed.

  deeper = _shapes('ViT-testing', num_layers=3)
  with pytest.raises(ValueError, match=r'encoderblock_2/\S+: missing vs \(32,\)'):
    checkpoint.load_pretrained(path, deeper)
  with pytest.raises(ValueError, match=r"dist: missing vs \(1, 1, 32\)"):
    checkpoint.load_pretrained(path, _shapes('DeiT-testing'))
  with pytest.raises(ValueError, match='embedding/kernel: .* vs'):
    convert.from_timm(convert.to_timm(_random_params('ViT-testing')), wider)


def test_corrupt_files_are_clear_errors(tmp_path):
  good = tmp_path / 'good.npz'
  checkpoint.save_npz(good, _random_params('ViT-testing'))
  data = good.read_bytes()
  truncated = tmp_path / 'truncated.npz'
  truncated.write_bytes(data[:len(data) // 2])
  garbage = tmp_path / 'garbage.npz'
  garbage.write_bytes(b'not a checkpoint' * 10)

  for path in (truncated, garbage):
    with pytest.raises(ValueError, match=f'Cannot read checkpoint {path}.*corrupt'):
      checkpoint.load_npz(path)
  with pytest.raises(FileNotFoundError, match='missing.npz'):
    checkpoint.load_npz(tmp_path / 'missing.npz')

  timm_file = tmp_path / 'model.safetensors'
  convert.save_safetensors(timm_file, convert.to_timm(_random_params('ViT-testing')))
  timm_data = timm_file.read_bytes()
  timm_file.write_bytes(timm_data[:len(timm_data) - 100])
  with pytest.raises(ValueError, match=f'Cannot read checkpoint {timm_file}.*corrupt'):
    convert.load_safetensors(timm_file)


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path, monkeypatch):
  path = tmp_path / 'params.npz'
  params = _random_params('ViT-testing')
  checkpoint.save_npz(path, params)
  original = path.read_bytes()

  with pytest.raises(FileExistsError, match='overwrite'):
    checkpoint.save_npz(path, _random_params('DeiT-testing'))
  assert path.read_bytes() == original

  def crash_half_way(file, **arrays):
    file.write(b'PK\x03\x04 half a file')
    raise KeyboardInterrupt  # E.g. the job is killed while writing.

  monkeypatch.setattr(np, 'savez', crash_half_way)
  with pytest.raises(KeyboardInterrupt):
    checkpoint.save_npz(path, params, overwrite=True)
  with pytest.raises(KeyboardInterrupt):
    checkpoint.save_npz(tmp_path / 'new.npz', params)
  monkeypatch.undo()
  assert path.read_bytes() == original
  assert sorted(os.listdir(tmp_path)) == ['params.npz']  # No half file, no temp file.

  checkpoint.save_npz(path, _random_params('DeiT-testing'), overwrite=True)
  assert 'dist' in checkpoint.load_npz(path)


# ----------------------------------------------------------------------------
# Command line.


def test_cli_converts_both_ways(tmp_path, capsys):
  for name in ('R+ViT-testing', 'DeiT-testing'):
    params = _random_params(name)
    npz, timm_file, back = (tmp_path / f'{name}{ext}'
                            for ext in ('.npz', '.safetensors', '.back.npz'))
    checkpoint.save_npz(npz, _per_type_numbering(_flat(params)))  # Normalised on the way.

    assert convert.main([str(npz), str(timm_file)]) == 0
    assert convert.main([str(timm_file), str(back), '--model', name]) == 0

    np.testing.assert_equal(convert.load_safetensors(timm_file), convert.to_timm(params))
    _assert_trees_equal(checkpoint.load_npz(back), params)
  assert 'Wrote' in capsys.readouterr().out


def test_cli_refuses_existing_destination(tmp_path, capsys):
  src, dst = tmp_path / 'src.npz', tmp_path / 'dst.safetensors'
  checkpoint.save_npz(src, _random_params('ViT-testing'))
  dst.write_bytes(b'precious')

  assert convert.main([str(src), str(dst)]) == 1
  assert '--overwrite' in capsys.readouterr().err
  assert dst.read_bytes() == b'precious'

  assert convert.main([str(src), str(dst), '--overwrite']) == 0
  assert 'blocks.0.attn.qkv.weight' in convert.load_safetensors(dst)


def test_cli_corrupt_source_leaves_destination_alone(tmp_path, capsys):
  src = tmp_path / 'src.npz'
  checkpoint.save_npz(src, _random_params('ViT-testing'))
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
  checkpoint.save_npz(src, params)
  convert.save_safetensors(timm_file, convert.to_timm(params))

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
  checkpoint.save_npz(npz, params)
  convert.save_safetensors(timm_file, convert.to_timm(params))
  orbax_dir = tmp_path / 'orbax'
  orbax_dir.mkdir()

  cases = [([str(orbax_dir), str(tmp_path / 'x.npz')], 'not a vit_jax workdir'),
           ([str(npz), str(orbax_dir)], 'already exists; pass --overwrite'),
           ([str(npz), str(tmp_path / 'x.pt')], 'extension'),
           ([str(timm_file), str(tmp_path / 'y.npz')], '--model'),
           ([str(npz), str(tmp_path / 'z.npz'), '--model', 'DeiT-testing'],
            'not a DeiT-testing checkpoint')]
  for argv, message in cases:
    assert convert.main(argv) == 1, argv
    assert message in capsys.readouterr().err, argv
  assert sorted(os.listdir(tmp_path)) == ['orbax', 'vit.npz', 'vit.safetensors']


def test_cli_runs_as_module(tmp_path):
  src = tmp_path / 'src.npz'
  checkpoint.save_npz(src, _random_params('ViT-testing'))
  result = subprocess.run([sys.executable, '-m', 'vit_jax.convert', '--print', str(src)],
                          capture_output=True, text=True, check=False, timeout=120)
  assert result.returncode == 0, result.stderr
  assert 'head/kernel' in result.stdout


# ----------------------------------------------------------------------------
# Against timm itself (only where torch and timm are installed).


def _timm_model(name, num_classes, size):
  """The timm model with our architecture and our numerics (tanh GELU, Flax eps)."""
  torch = pytest.importorskip('torch')
  timm = pytest.importorskip('timm')
  layers, vit_models = timm.layers, timm.models

  config = model_config(name)
  kwargs = dict(img_size=size, patch_size=config['patch_size'][0],
                embed_dim=config['hidden_size'], depth=config['num_layers'],
                num_heads=config['num_heads'],
                mlp_ratio=config['mlp_dim'] / config['hidden_size'],
                num_classes=num_classes,
                act_layer=functools.partial(torch.nn.GELU, approximate='tanh'))
  if config.get('resnet_layers') is not None:
    backbone = vit_models.resnetv2.ResNetV2(
        layers=config['resnet_layers'], num_classes=0, global_pool='', preact=False,
        stem_type='same', width_factor=config.get('resnet_width_factor', 1),
        conv_layer=functools.partial(layers.StdConv2dSame, eps=1e-5),  # timm's hybrids: 1e-8.
        norm_layer=functools.partial(layers.GroupNormAct, num_groups=32, eps=1e-6))
    kwargs['embed_layer'] = functools.partial(layers.HybridEmbed, backbone=backbone)
  if config.get('classifier') == 'token_distill':
    return vit_models.deit.VisionTransformerDistilled(**kwargs).eval()
  return vit_models.vision_transformer.VisionTransformer(**kwargs).eval()


@pytest.mark.parametrize('name', MODELS)
def test_timm_model_gives_the_same_logits(name, tmp_path):
  torch = pytest.importorskip('torch')
  timm_model = _timm_model(name, NUM_CLASSES, SIZE)
  params = _random_params(name)
  path = tmp_path / 'model.safetensors'
  convert.save_safetensors(path, convert.to_timm(params))

  state_dict = {k: torch.from_numpy(v) for k, v in convert.load_safetensors(path).items()}
  timm_model.load_state_dict(state_dict, strict=True)
  with torch.no_grad():
    theirs = timm_model(torch.from_numpy(_images()).permute(0, 3, 1, 2)).numpy()

  np.testing.assert_allclose(theirs, _logits(name, params), atol=1e-4)
  _assert_trees_equal(
      convert.from_timm({k: v.numpy() for k, v in timm_model.state_dict().items()},
                        _shapes(name)), params)
