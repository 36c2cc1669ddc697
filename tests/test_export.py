"""`python -m vit_jax.export`: StableHLO, SavedModel and ONNX artifacts equal the JAX model,
and with --preprocess, `predict` on the picture files. (Its flags and errors:
test_export_cli.py.)"""

import json
import logging
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from export_fixtures import (EVAL_RESIZE_RATIO, IMAGE_SIZE, SOURCES, assert_equals_predict,
                             run_artifact)
from helpers import REPO, user_error
from PIL import Image

from vit_jax import export
from vit_jax.data import normalization
from vit_jax.train import prediction, run_config

# Its tests share costly fixtures with test_export_cli.py (export_fixtures): one worker runs
# them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('export')

BATCH_SIZES = (1, 3)


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
    got = run_artifact(out, export_format, images)
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
  got = run_artifact(out, export_format, images)['logits']
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
  assert_equals_predict(out, export_format, image_files, want, '--preprocess')


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
  assert_equals_predict(out, 'savedmodel', image_files, want, '--preprocess (CLI)')
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
  assert_equals_predict(out, 'stablehlo', image_files, want, '--preprocess ImageNet stats')
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
  assert_equals_predict(out, export_format, pictures, want,
                         '--preprocess shorter_side bicubic')
  metadata = json.loads((tmp_path / 'out' / 'metadata.json').read_text())
  assert (metadata['eval_resize'], metadata['eval_interpolation'],
          metadata['eval_resize_ratio']) == ('shorter_side', 'bicubic', EVAL_RESIZE_RATIO)


def _cli_subprocess_error(argv) -> str:
  result = subprocess.run([sys.executable, '-m', 'vit_jax.export', *argv], cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert result.returncode == 1, result.stdout + result.stderr
  return user_error(result.stderr)
