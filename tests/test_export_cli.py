"""`python -m vit_jax.export`'s flags on a .npz SOURCE, and its mistakes: one line each, and
nothing written. (What the artifacts compute: test_export.py.)"""

import json
import os
import shutil
import sys

import numpy as np
from export_fixtures import IMAGE_SIZE, assert_equals_predict, run_artifact
from helpers import user_error
import pytest

from vit_jax.data import normalization
from vit_jax.export import __main__ as cli
from vit_jax.train import prediction, run_config

# The fixtures of test_export.py (export_fixtures), built once on the worker that runs both.
pytestmark = pytest.mark.xdist_group('export')


def _cli_error(capsys, argv) -> str:
  assert cli.main(argv) == 1
  return user_error(capsys.readouterr().err)


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
  got = run_artifact(str(tmp_path / 'pre'), 'stablehlo', pixels)['logits']
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
  assert_equals_predict(out, 'stablehlo', image_files, want, '--preprocess DeiT flags')
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
