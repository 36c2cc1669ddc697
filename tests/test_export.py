"""`python -m vit_jax.export`: StableHLO, SavedModel and ONNX artifacts equal the JAX model."""

import json
import logging
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from helpers import REPO, override, user_error

from vit_jax import export, main, models, weights
from vit_jax.data import normalization
from vit_jax.export import __main__ as cli
from vit_jax.train import config as config_lib, prediction, run_config

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('export')

WORKDIR_MODELS = {'ViT-testing': 4, 'R+ViT-testing': 1, 'DeiT-testing': 4}  # name -> patch.
SOURCES = [*WORKDIR_MODELS, 'npz']
BATCH_SIZES = (1, 3)
IMAGE_SIZE = 8
EVAL_RESIZE_RATIO = 1.25  # Preprocessing resizes to 10x10 and crops the central 8x8.


def tiny_config(name: str):
  config = config_lib.classification_config(name)
  config.model.patch_size = (WORKDIR_MODELS[name],) * 2
  return override(config, {'data.image_size': IMAGE_SIZE, 'data.eval_resize_ratio':
                           EVAL_RESIZE_RATIO, 'batch_size': 32, 'eval_batch_size': 360,
                           'total_steps': 1, 'optimizer.learning_rate': 0.1, 'log_every': 1,
                           'eval_every': 0, 'checkpoint_every': 0})


@pytest.fixture(scope='module')
def sources(tmp_path_factory):
  """name -> (path, reference JAX model, its params, model name) for each SOURCE."""
  root = tmp_path_factory.mktemp('sources')
  found = {}
  for name in WORKDIR_MODELS:
    workdir = str(root / name)
    config = tiny_config(name)
    main.run(config, workdir)
    model, params, _ = prediction.load_model_and_params(config, workdir)
    found[name] = (workdir, model, params, name)
  model = models.get_model('ViT-testing', num_classes=7, patch_size=(4, 4))
  params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, IMAGE_SIZE, IMAGE_SIZE, 3)))['params']
  keys = iter(jax.random.split(jax.random.PRNGKey(2), 100))
  params = jax.tree.map(lambda a: np.asarray(a + 0.3 * jax.random.normal(next(keys), a.shape)),
                        params)
  path = str(root / 'published.npz')
  weights.save_npz(path, weights.canonicalize(params))
  found['npz'] = (path, model, params, 'ViT-testing')
  return found


def _run(artifact_dir: str, export_format: str, images: np.ndarray) -> dict:
  """{'logits', 'probabilities'} of an exported artifact, run by its own runtime only."""
  if export_format == 'stablehlo':
    with open(os.path.join(artifact_dir, 'model.stablehlo'), 'rb') as f:
      exported = jax.export.deserialize(bytearray(f.read()))
    return {name: np.asarray(value) for name, value in exported.call(images).items()}
  if export_format == 'savedmodel':
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    signature = tf.saved_model.load(artifact_dir).signatures['serving_default']
    return {name: value.numpy() for name, value in signature(images=tf.constant(images)).items()}
  import onnxruntime  # pylint: disable=g-import-not-at-top
  session = onnxruntime.InferenceSession(os.path.join(artifact_dir, 'model.onnx'))
  return dict(zip(['logits', 'probabilities'],
                  session.run(['logits', 'probabilities'], {'images': images})))


def _model_inputs(batch: int, seed: int) -> np.ndarray:
  shape = (batch, IMAGE_SIZE, IMAGE_SIZE, 3)
  return np.random.RandomState(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize('export_format', export.FORMATS)
@pytest.mark.parametrize('source', SOURCES)
def test_the_artifact_equals_the_jax_model_at_two_batch_sizes(sources, source, export_format,
                                                              tmp_path):
  if export_format == 'onnx':
    pytest.importorskip('jax2onnx')
  path, model, params, model_name = sources[source]
  out = str(tmp_path / 'out')
  export.export(path, out, export_format, model_name=model_name if source == 'npz' else None)
  apply = jax.jit(lambda images: model.apply({'params': params}, images))
  for batch in BATCH_SIZES:
    images = _model_inputs(batch, seed=batch)
    want = np.asarray(apply(images))
    got = _run(out, export_format, images)
    difference = float(np.abs(got['logits'] - want).max())
    print(f'{source} {export_format} batch {batch}: max |logits - JAX| {difference:.1e} '
          f'(max |logit| {np.abs(want).max():.2f})')
    np.testing.assert_allclose(got['logits'], want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got['probabilities'], jax.nn.softmax(want), atol=1e-5)
  metadata = json.loads((tmp_path / 'out' / 'metadata.json').read_text())
  assert metadata['model'] == model_name and metadata['image_size'] == IMAGE_SIZE
  assert len(metadata['class_names']) == model.num_classes
  if source != 'npz':
    assert metadata['class_names'] == [str(digit) for digit in range(10)]
  if export_format == 'savedmodel':
    assert (tmp_path / 'out' / 'assets' / 'metadata.json').exists()
  if export_format == 'onnx':
    import onnx  # pylint: disable=g-import-not-at-top
    props = {p.key: p.value for p in onnx.load(str(tmp_path / 'out' / 'model.onnx')).metadata_props}
    assert json.loads(props['vit_jax'])['model'] == model_name


@pytest.mark.parametrize('export_format', ['stablehlo', 'savedmodel'])
def test_bfloat16_artifacts_equal_the_bfloat16_jax_model(sources, tmp_path, export_format):
  path, model, params, _ = sources['ViT-testing']
  out = str(tmp_path / 'out')
  export.export(path, out, export_format, dtype='bfloat16', batch_size=2)
  images = _model_inputs(2, seed=5)
  want = np.asarray(jax.jit(model.clone(dtype=jnp.bfloat16).apply)({'params': params}, images))
  got = _run(out, export_format, images)['logits']
  full = np.asarray(jax.jit(model.apply)({'params': params}, images))
  print(f'bfloat16 {export_format}: max |logits - bfloat16 JAX| {np.abs(got - want).max():.1e}, '
        f'- float32 JAX {np.abs(got - full).max():.1e} (max |logit| {np.abs(full).max():.2f})')
  np.testing.assert_allclose(got, want, atol=3e-2)
  assert json.loads((tmp_path / 'out' / 'metadata.json').read_text())['dtype'] == 'bfloat16'
  if export_format == 'savedmodel':
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # The weights the model casts to bfloat16 are stored so: about half the bytes.
    def flat(tree, path=''):
      if hasattr(tree, 'items'):
        return [item for key, sub in tree.items() for item in flat(sub, f'{path}/{key}')]
      return [(path, tree)]

    variables = flat(tf.saved_model.load(out).params)
    dtypes = {name: v.dtype for name, v in variables}
    assert len(dtypes) == len(jax.tree.leaves(params))
    assert {name for name, dtype in dtypes.items() if dtype == tf.float32} == {
        name for name in dtypes if 'LayerNorm' in name or 'encoder_norm' in name} != set()
    stored = sum(v.numpy().nbytes for _, v in variables)
    assert stored < 0.55 * sum(np.asarray(a).nbytes for a in jax.tree.leaves(params))


@pytest.fixture(scope='module')
def image_files(tmp_path_factory):
  """Two PNGs of other sizes than the model's: 13x21 and 8x8."""
  root = tmp_path_factory.mktemp('images')
  paths = []
  for index, (height, width) in enumerate([(13, 21), (8, 8)]):
    pixels = np.random.RandomState(index).randint(0, 256, (height, width, 3)).astype(np.uint8)
    paths.append(str(root / f'image{index}.png'))
    Image.fromarray(pixels).save(paths[-1])
  return paths


PREPROCESS_TOLERANCE = 1e-5  # Probabilities; the resized pixels equal TF's (see test output).


def _assert_equals_predict(artifact_dir: str, export_format: str, pictures, want, what: str):
  """The artifact's probabilities on each picture file, uint8 as it is, equal predict's."""
  for path, expected in zip(pictures, want):
    pixels = np.asarray(Image.open(path))[None]
    got = _run(artifact_dir, export_format, pixels)['probabilities'][0]
    print(f'{export_format} {what} {pixels.shape[1]}x{pixels.shape[2]}: max '
          f'|probabilities - predict| {np.abs(got - expected).max():.1e}')
    np.testing.assert_allclose(got, expected, atol=PREPROCESS_TOLERANCE)


@pytest.mark.parametrize('export_format', ['stablehlo', 'onnx'])
def test_preprocessing_artifacts_equal_predict_on_uint8_images(sources, image_files,
                                                               export_format, tmp_path):
  if export_format == 'onnx':
    pytest.importorskip('jax2onnx')
  workdir, model, params, _ = sources['ViT-testing']
  config = run_config.load_config(workdir)
  _, want = prediction.predict_files(model, params, image_files, config.data, batch_size=1)
  out = str(tmp_path / 'out')
  export.export(workdir, out, export_format, preprocess=True)
  _assert_equals_predict(out, export_format, image_files, want, '--preprocess')


def test_the_command_line_writes_a_preprocessing_savedmodel(sources, image_files, tmp_path):
  workdir, model, params, _ = sources['ViT-testing']
  out = str(tmp_path / 'saved')
  result = subprocess.run([sys.executable, '-m', 'vit_jax.export', workdir, out, '--format',
                           'savedmodel', '--preprocess', '--batch-size', '1'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert f'Wrote {out}' in result.stdout
  config = run_config.load_config(workdir)
  _, want = prediction.predict_files(model, params, image_files, config.data, batch_size=1)
  _assert_equals_predict(out, 'savedmodel', image_files, want, '--preprocess (CLI)')
  metadata = json.loads((tmp_path / 'saved' / 'metadata.json').read_text())
  assert metadata['inputs'][0] == {'name': 'images', 'dtype': 'uint8', 'shape': [1, 'h', 'w', 3],
                                   'range': '0..255, any height and width'}


def test_a_workdir_trained_with_imagenet_statistics_exports_them(sources, image_files, tmp_path):
  # DeiT's inputs: (pixels / 255 - ImageNet mean) / ImageNet std, as its run's config says.
  workdir, model, params, _ = sources['ViT-testing']
  imagenet = str(tmp_path / 'imagenet')
  shutil.copytree(workdir, imagenet)
  saved = json.loads(open(run_config.config_path(imagenet), encoding='utf-8').read())
  saved['data'].update(pixel_mean=list(normalization.IMAGENET_MEAN),
                       pixel_std=list(normalization.IMAGENET_STD))
  with open(run_config.config_path(imagenet), 'w', encoding='utf-8') as f:
    json.dump(saved, f)
  out = str(tmp_path / 'out')
  result = subprocess.run([sys.executable, '-m', 'vit_jax.export', imagenet, out, '--format',
                           'stablehlo', '--preprocess'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  config = run_config.load_config(imagenet)
  _, want = prediction.predict_files(model, params, image_files, config.data, batch_size=1)
  _, unit_range = prediction.predict_files(model, params, image_files,
                                           run_config.load_config(workdir).data, batch_size=1)
  assert np.abs(want - unit_range).max() > 1e-3  # The statistics matter to this model.
  _assert_equals_predict(out, 'stablehlo', image_files, want, '--preprocess ImageNet stats')
  metadata = json.loads((tmp_path / 'out' / 'metadata.json').read_text())
  assert metadata['pixel_mean'] == list(normalization.IMAGENET_MEAN)
  assert metadata['pixel_std'] == list(normalization.IMAGENET_STD)
  line = _cli_subprocess_error([imagenet, str(tmp_path / 'again'), '--format', 'stablehlo',
                                '--pixel-mean', '0.5'])
  assert line == (f'error: --pixel-mean and --pixel-std describe a .npz SOURCE; the workdir '
                  f'{imagenet} was trained with config.data.pixel_mean=(0.485, 0.456, 0.406) and '
                  'pixel_std=(0.229, 0.224, 0.225) (its config.json), which the export takes: '
                  'leave them out.')


@pytest.mark.parametrize('export_format', ['stablehlo', 'onnx'])
def test_a_workdir_with_deits_eval_resize_exports_it(sources, image_files, export_format,
                                                     tmp_path, caplog):
  # DeiT's eval: the shorter side resized to 10, the aspect ratio kept, bicubic; the central 8x8.
  if export_format == 'onnx':
    pytest.importorskip('jax2onnx')
  workdir, model, params, _ = sources['ViT-testing']
  deit = str(tmp_path / 'deit')
  shutil.copytree(workdir, deit)
  saved = json.loads(open(run_config.config_path(deit), encoding='utf-8').read())
  saved['data'].update(eval_resize='shorter_side', eval_interpolation='bicubic')
  with open(run_config.config_path(deit), 'w', encoding='utf-8') as f:
    json.dump(saved, f)
  tall = str(tmp_path / 'tall.png')  # The 13x21 picture on its side: 21x13.
  Image.fromarray(np.asarray(Image.open(image_files[0])).transpose(1, 0, 2)).save(tall)
  pictures = [*image_files, tall]
  _, want = prediction.predict_files(model, params, pictures,
                                     run_config.load_config(deit).data, batch_size=1)
  _, square = prediction.predict_files(model, params, pictures,
                                       run_config.load_config(workdir).data, batch_size=1)
  assert np.abs(want - square).max(axis=1).min() > 1e-3  # Each picture resizes otherwise.
  out = str(tmp_path / 'out')
  with caplog.at_level(logging.WARNING):
    export.export(deit, out, export_format, preprocess=True)
  # No converter complaints on the user's screen (jax2onnx left jnp's != untyped).
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
  _assert_equals_predict(out, export_format, pictures, want,
                         '--preprocess shorter_side bicubic')
  metadata = json.loads((tmp_path / 'out' / 'metadata.json').read_text())
  assert (metadata['eval_resize'], metadata['eval_interpolation'],
          metadata['eval_resize_ratio']) == ('shorter_side', 'bicubic', EVAL_RESIZE_RATIO)


def _cli_subprocess_error(argv) -> str:
  result = subprocess.run([sys.executable, '-m', 'vit_jax.export', *argv], cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert result.returncode == 1, result.stdout + result.stderr
  return user_error(result.stderr)


def test_a_npz_takes_the_pixel_statistics_given_on_the_command_line(sources, tmp_path, capsys):
  path, model, params, model_name = sources['npz']
  out = str(tmp_path / 'out')
  assert cli.main([path, out, '--format', 'stablehlo', '--model', model_name, '--pixel-mean',
                   '0.485,0.456,0.406', '--pixel-std', '0.229,0.224,0.225']) == 0
  metadata = json.loads((tmp_path / 'out' / 'metadata.json').read_text())
  assert metadata['pixel_mean'] == [0.485, 0.456, 0.406]
  assert metadata['inputs'][0]['range'] == '(pixels / 255 - pixel_mean) / pixel_std'
  # The preprocessing artifact: uint8 pixels in, normalized with those statistics.
  assert cli.main([path, str(tmp_path / 'pre'), '--format', 'stablehlo', '--model', model_name,
                   '--preprocess', '--pixel-mean', '0.485,0.456,0.406', '--pixel-std',
                   '0.229,0.224,0.225']) == 0
  pixels = np.random.RandomState(3).randint(0, 256, (2, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(
      np.uint8)
  inputs = (pixels / 255 - np.array(normalization.IMAGENET_MEAN)) / np.array(
      normalization.IMAGENET_STD)
  want = np.asarray(model.apply({'params': params}, inputs.astype(np.float32)))
  got = _run(str(tmp_path / 'pre'), 'stablehlo', pixels)['logits']
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  line = _cli_error(capsys, [path, str(tmp_path / 'bad'), '--format', 'stablehlo', '--model',
                             model_name, '--pixel-std', '0.2,0.3'])
  assert line == ('error: --pixel-std 0.2,0.3 has 2 values for 3 channels: give one per '
                  'channel or one for all, e.g. --pixel-std 0.5,0.5,0.5.')


def test_a_npz_takes_deits_eval_resize_on_the_command_line(sources, image_files, tmp_path,
                                                           capsys):
  path, model, params, model_name = sources['npz']
  deit = {'image_size': IMAGE_SIZE, 'eval_resize': 'shorter_side',
          'eval_interpolation': 'bicubic', 'eval_resize_ratio': 1.25}
  out = str(tmp_path / 'out')
  assert cli.main([path, out, '--format', 'stablehlo', '--model', model_name, '--preprocess',
                   '--eval-resize', 'shorter_side', '--eval-interpolation', 'bicubic',
                   '--eval-resize-ratio', '1.25']) == 0
  _, want = prediction.predict_files(model, params, image_files, deit, batch_size=1)
  _assert_equals_predict(out, 'stablehlo', image_files, want, '--preprocess DeiT flags')
  metadata = json.loads((tmp_path / 'out' / 'metadata.json').read_text())
  assert (metadata['eval_resize'], metadata['eval_interpolation'],
          metadata['eval_resize_ratio']) == ('shorter_side', 'bicubic', 1.25)
  # Without them, Google's ViT eval: square, bilinear, the model's size.
  assert cli.main([path, str(tmp_path / 'vit'), '--format', 'stablehlo', '--model', model_name,
                   '--preprocess']) == 0
  metadata = json.loads((tmp_path / 'vit' / 'metadata.json').read_text())
  assert (metadata['eval_resize'], metadata['eval_interpolation'],
          metadata['eval_resize_ratio']) == ('square', 'bilinear', 1.0)
  # Mistakes, one line each.
  npz = [path, str(tmp_path / 'bad'), '--format', 'stablehlo', '--model', model_name]
  assert _cli_error(capsys, [*npz, '--preprocess', '--eval-resize', 'shorter']) == (
      'error: --eval-resize shorter is not one of square, shorter_side.')
  assert _cli_error(capsys, [*npz, '--preprocess', '--eval-resize-ratio', '0.9']) == (
      "error: --eval-resize-ratio 0.9 must be at least 1 (1: resize to the model's size; DeiT: "
      '256/224 = 1.1428571).')
  assert _cli_error(capsys, [*npz, '--eval-interpolation', 'bicubic']) == (
      'error: --eval-resize, --eval-interpolation and --eval-resize-ratio say how --preprocess '
      'resizes images: add --preprocess, or leave them out.')
  workdir = sources['ViT-testing'][0]
  assert _cli_error(capsys, [workdir, str(tmp_path / 'bad'), '--format', 'stablehlo',
                             '--preprocess', '--eval-resize', 'shorter_side']) == (
      'error: --eval-resize, --eval-interpolation and --eval-resize-ratio describe a .npz SOURCE; '
      f'the workdir {workdir} evaluates with config.data.eval_resize=\'square\', '
      "eval_interpolation='bilinear' and eval_resize_ratio=1.25 (its config.json), which the "
      'export takes: leave them out.')
  assert not (tmp_path / 'bad').exists()


def _cli_error(capsys, argv) -> str:
  assert cli.main(argv) == 1
  return user_error(capsys.readouterr().err)


def test_an_unknown_format_is_one_line_and_writes_nothing(sources, tmp_path, capsys):
  out = tmp_path / 'out'
  line = _cli_error(capsys, [sources['ViT-testing'][0], str(out), '--format', 'tflite'])
  assert "--format='tflite' is not a known format; use one of stablehlo" in line
  assert not out.exists()


def test_a_workdir_without_a_checkpoint_is_one_line_and_writes_nothing(sources, tmp_path,
                                                                       capsys):
  workdir = tmp_path / 'untrained'
  workdir.mkdir()
  shutil.copy(run_config.config_path(sources['ViT-testing'][0]), workdir / 'config.json')
  out = tmp_path / 'out'
  line = _cli_error(capsys, [str(workdir), str(out), '--format', 'stablehlo'])
  assert 'No checkpoint in' in line and 'train first' in line
  assert not out.exists()


def test_bfloat16_onnx_is_one_line_and_writes_nothing(sources, tmp_path, capsys):
  out = tmp_path / 'out'
  line = _cli_error(capsys, [sources['ViT-testing'][0], str(out), '--format', 'onnx',
                             '--dtype', 'bfloat16'])
  assert 'export ONNX in float32' in line
  assert not out.exists()


def test_an_existing_output_needs_overwrite(sources, tmp_path, capsys):
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'kept.txt').write_text('mine')
  line = _cli_error(capsys, [sources['ViT-testing'][0], str(out), '--format', 'stablehlo'])
  assert 'already exists; pass --overwrite' in line
  assert os.listdir(out) == ['kept.txt']
  assert sorted(os.listdir(tmp_path)) == ['out']  # No staging directory left behind.


def test_overwrite_replaces_an_earlier_export_and_nothing_else(sources, tmp_path, capsys,
                                                              monkeypatch):
  source = sources['npz'][0]
  flags = ['--format', 'stablehlo', '--model', 'ViT-testing', '--overwrite']
  out = tmp_path / 'out'
  assert cli.main([source, str(out), *flags]) == 0
  assert cli.main([source, str(out), *flags]) == 0  # An earlier export: replaced.
  assert sorted(os.listdir(out)) == ['metadata.json', 'model.stablehlo']
  (tmp_path / 'plain').mkdir()  # Readable by others as any new directory is (the umask's).
  assert os.stat(out).st_mode == os.stat(tmp_path / 'plain').st_mode
  capsys.readouterr()

  mine = tmp_path / 'mine'  # A folder of the user's (or a workdir) is never removed.
  mine.mkdir()
  (mine / 'notes.txt').write_text('mine')
  line = _cli_error(capsys, [source, str(mine), *flags])
  assert line == (f'error: --overwrite replaces an earlier export (a directory with its '
                  f'metadata.json), and {mine} is not one; remove it yourself, or give another '
                  'path.')
  line = _cli_error(capsys, [source, sources['ViT-testing'][0], *flags])
  assert 'is not one; remove it yourself' in line
  assert os.listdir(mine) == ['notes.txt']
  monkeypatch.chdir(mine)
  line = _cli_error(capsys, [source, '.', *flags])
  assert line == ('error: --overwrite would replace ., the current directory or one above it; '
                  'give a new directory for the output.')
  assert os.listdir(mine) == ['notes.txt']
  line = _cli_error(capsys, [source, 'notes.txt/out', '--format', 'stablehlo', '--model',
                             'ViT-testing'])
  assert line.startswith('error: Cannot write notes.txt/out: not a directory (')


def test_onnx_without_jax2onnx_says_what_to_install(sources, tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, 'jax2onnx', None)  # Its import fails.
  out = tmp_path / 'out'
  line = _cli_error(capsys, [sources['ViT-testing'][0], str(out), '--format', 'onnx'])
  assert "pip install 'vit_jax[export]'" in line
  assert not out.exists()


def test_ema_of_a_run_without_one_and_a_npz_without_model_are_one_line(sources, tmp_path,
                                                                       capsys):
  out = tmp_path / 'out'
  line = _cli_error(capsys, [sources['ViT-testing'][0], str(out), '--format', 'stablehlo',
                             '--ema'])
  assert 'EMA' in line
  line = _cli_error(capsys, [sources['npz'][0], str(out), '--format', 'stablehlo'])
  assert 'give --model' in line
  line = _cli_error(capsys, [sources['npz'][0], str(out), '--format', 'stablehlo', '--model',
                             'ViT-testing', '--checkpoint-fallback'])
  assert line.endswith('is a .npz, which holds one set of weights: leave --checkpoint-fallback '
                       'out.'), line
  assert not out.exists()


def test_an_image_size_off_the_patch_grid_is_one_line(sources, tmp_path, capsys):
  line = _cli_error(capsys, [sources['npz'][0], str(tmp_path / 'out'), '--format', 'stablehlo',
                             '--model', 'ViT-testing', '--image-size', '10'])
  assert line == ("error: --image-size=10 is not a multiple of 4, the ViT-testing's patch size "
                  "(times its stem's stride); give a multiple of 4, e.g. 8.")
