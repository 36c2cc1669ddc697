"""trainer=predict: what is in these pictures, from a workdir or a published .npz, with no
dataset built."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image
from helpers import override, user_error

from vit_jax import errors, main, models, progress, weights
from vit_jax.data import class_names, images, normalization, sources
from vit_jax.train import checkpointing, config as config_lib, prediction

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('prediction')

REPO = pathlib.Path(__file__).resolve().parents[1]
# ViT-B_16 narrowed on the command line, as a user would for a quick try.
NARROW = ['--config.model.hidden_size=32', '--config.model.mlp_dim=64',
          '--config.model.num_heads=2', '--config.model.num_layers=1',
          '--config.data.image_size=32']


def run_main(*args, env=None):
  return subprocess.run([sys.executable, '-m', 'vit_jax.main', *args], capture_output=True,
                        text=True, cwd=REPO, timeout=300, env=env)


def _photos(folder: pathlib.Path, sizes=((40, 30), (24, 24), (64, 48))) -> list[str]:
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  paths = []
  for i, (width, height) in enumerate(sizes):
    path = folder / f'photo_{i}.png'
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    paths.append(str(path))
  return paths


def test_predict_from_a_published_npz_names_imagenet_classes(tmp_path):
  model = models.get_model('ViT-B_16', num_classes=1000, hidden_size=32, mlp_dim=64,
                           num_heads=2, num_layers=1)
  params = model.init(jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  params = jax.tree.map(lambda x: np.asarray(x) + np.random.default_rng(1).normal(
      0, 0.02, x.shape).astype(np.float32), params)  # A head that prefers some classes.
  npz = tmp_path / 'ViT-B_16.npz'
  weights.save_npz(npz, weights.canonicalize(params))
  _photos(tmp_path / 'photos')
  tfds_dir = tmp_path / 'tfds'
  tfds_dir.mkdir()
  out = run_main('--config=configs/vit.py:ViT-B_16,imagenet2012', '--config.trainer=predict',
                 f'--config.pretrained={npz}', f'--config.predict.inputs={tmp_path}/photos',
                 f'--config.predict.output_file={tmp_path}/top5.jsonl',
                 f'--config.data.tfds_data_dir={tfds_dir}', *NARROW)
  assert out.returncode == 0, out.stderr
  names = class_names.imagenet2012()
  assert len(names) == 1000 and names[0] == 'tench, Tinca tinca'
  rows = [json.loads(line) for line in (tmp_path / 'top5.jsonl').read_text().splitlines()]
  assert [pathlib.Path(r['file']).name for r in rows] == [f'photo_{i}.png' for i in range(3)]
  for row in rows:
    predictions = row['predictions']
    assert len(predictions) == 5
    assert [p['name'] for p in predictions] == [names[p['class']] for p in predictions]
    probabilities = [p['probability'] for p in predictions]
    assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1
    # Printed: the file, then its five classes by name with their probabilities.
    block = out.stdout.split(row['file'] + '\n', 1)[1].splitlines()[:5]
    for line, p in zip(block, predictions):
      assert re.fullmatch(rf'\s+{100 * p["probability"]:.2f}%  '
                          rf'{re.escape(p["name"])} \({p["class"]}\)', line), line
  assert list(tfds_dir.iterdir()) == []  # No dataset was built (imagenet2012 is not here).


@pytest.fixture(scope='module')
def digits_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('predict')
  config = config_lib.classification_config('ViT-testing')
  override(config, {'model.patch_size': (4, 4), 'data.image_size': 8, 'batch_size': 32,
                    'eval_batch_size': 60, 'total_steps': 30, 'log_every': 10,
                    'eval_every': 0, 'checkpoint_every': 0})
  main.run(config, str(root / 'run'))
  return root, config


def test_predict_on_a_digits_workdir_agrees_with_evaluation(digits_run):
  root, config = digits_run
  workdir = root / 'run'
  # Evaluation's per-example argmax: the test split through the eval pipeline and the model.
  data = images.build(config.data)
  params, _ = checkpointing.restore_params(str(workdir))
  model = config_lib.build_model(config.model, num_classes=10)
  batch = next(data.eval_batches(60))
  evaluated = np.argmax(model.apply({'params': params}, batch['image']), -1)
  # The same digits as PNG files, predicted from the command line.
  digits, _ = sources.digits_splits()['test']
  folder = root / 'digits'
  folder.mkdir()
  for i in range(60):
    Image.fromarray(digits[i, :, :, 0]).save(folder / f'{i:02d}.png')
  out = run_main(f'--workdir={workdir}', '--config.trainer=predict',
                 f'--config.predict.inputs={folder}/*.png', '--config.predict.top_k=1',
                 f'--config.predict.output_file={root}/digits.jsonl',
                 '--config.predict.batch_size=16')
  assert out.returncode == 0, out.stderr
  rows = [json.loads(line) for line in (root / 'digits.jsonl').read_text().splitlines()]
  predicted = [row['predictions'][0]['class'] for row in rows]
  assert predicted == evaluated.tolist()
  assert len(set(predicted)) > 1  # A trained model, not a constant.
  assert [row['predictions'][0]['name'] for row in rows] == [str(c) for c in predicted]
  assert json.loads((workdir / 'class_names.json').read_text()) == [str(d) for d in range(10)]


def test_inputs_expand_files_folders_and_globs(tmp_path):
  paths = _photos(tmp_path / 'a')
  _photos(tmp_path / 'b' / 'nested')
  (tmp_path / 'b' / 'readme.txt').write_text('not an image')
  expanded = prediction.expand_inputs(f'{paths[0]}, {tmp_path}/b,{tmp_path}/a/photo_[12].png')
  assert expanded == [paths[0], *[f'{tmp_path}/b/nested/photo_{i}.png' for i in range(3)],
                      paths[1], paths[2]]
  with pytest.raises(FileNotFoundError, match=r"No file matches '.*/a/\*\.jpg'"):
    prediction.expand_inputs(f'{tmp_path}/a/*.jpg')
  with pytest.raises(ValueError, match='config.predict.inputs is empty'):
    prediction.expand_inputs(' , ')


def test_class_names_without_a_dataset(tmp_path):
  config = images.default_config()
  assert class_names.for_dataset(config) == tuple('0123456789')
  config.dataset = 'imagenet_v2'
  assert class_names.for_dataset(config)[281] == 'tabby, tabby cat'
  for label in ('dog', 'cat'):
    (tmp_path / 'pets' / 'train' / label).mkdir(parents=True)
  config.dataset = str(tmp_path / 'pets')
  assert class_names.for_dataset(config) == ('cat', 'dog')
  config.dataset = 'no_such_dataset_anywhere'
  assert class_names.for_dataset(config) is None


def test_a_checkpoint_with_a_pre_logits_layer_predicts_through_it(tmp_path):
  """ImageNet-21k checkpoints have a tanh pre-logits layer: the model is built with it."""
  model = models.get_model('ViT-testing', num_classes=5, patch_size=(4, 4),
                           representation_size=24)
  images_in = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
  params = model.init(jax.random.key(0), images_in)['params']
  npz = tmp_path / 'in21k.npz'
  weights.save_npz(npz, weights.canonicalize(params))
  config = config_lib.classification_config('ViT-testing')
  override(config, {'model.patch_size': (4, 4), 'data.image_size': 8, 'pretrained': str(npz),
                    'trainer': 'predict'})
  loaded_model, loaded, _ = prediction.load_model_and_params(config, None)
  assert loaded_model.representation_size == 24 and loaded_model.num_classes == 5
  np.testing.assert_array_equal(loaded_model.apply({'params': loaded}, images_in),
                                model.apply({'params': params}, images_in))


def test_a_workdir_is_fitted_to_the_image_size_and_refused_by_another_model(digits_run):
  root, _ = digits_run
  _photos(root / 'one')
  out = run_main(f'--workdir={root / "run"}', '--config.trainer=predict',
                 f'--config.predict.inputs={root}/one/photo_0.png', '--config.predict.top_k=1',
                 '--config.data.image_size=16')
  assert out.returncode == 0, out.stderr
  assert 'was trained at 8x8; predicting at 16x16' in out.stdout
  out = run_main(f'--workdir={root / "run"}', '--config.trainer=predict',
                 f'--config.predict.inputs={root}/one/photo_0.png',
                 '--config.model.hidden_size=48')
  assert re.fullmatch(r'error: \S+/checkpoints at step 30 does not fit the model: \d+ mismatched '
                      r'parameter\(s\) .*', user_error(out.stderr)), out.stderr


def test_files_that_are_not_images_are_skipped_and_said(digits_run):
  root, _ = digits_run
  folder = root / 'mixed'
  good = _photos(folder, sizes=((8, 8),))[0]
  (folder / 'empty.jpg').write_bytes(b'')
  png = pathlib.Path(good).read_bytes()
  (folder / 'truncated.png').write_bytes(png[:len(png) // 2])
  (folder / 'scan.tiff').write_bytes(b'II*\x00')  # Not read, but said.
  (folder / '.DS_Store').write_bytes(b'')  # Hidden: neither.
  out = run_main(f'--workdir={root / "run"}', '--config.trainer=predict',
                 f'--config.predict.inputs={folder}', '--config.predict.top_k=1')
  assert out.returncode == 0, out.stderr
  assert (f'Left out 1 file(s) in {folder} whose names do not end in .jpg/.jpeg/.png/.gif/.bmp, '
          f'e.g. {folder}/scan.tiff (name a file in config.predict.inputs to read it whatever its '
          'name).') in out.stdout.splitlines()
  printed = [line for line in out.stdout.splitlines() if line.startswith(str(folder))]
  assert printed == [good]
  skipped = [line for line in out.stdout.splitlines() if line.startswith('Skipped: ')]
  assert len(skipped) == 2 and skipped[0] == (
      f'Skipped: {folder}/empty.jpg is not an image that can be read (PNG, JPEG, GIF or BMP): '
      'its first bytes are those of none of these formats'), out.stdout
  assert 'truncated.png is not an image' in skipped[1]
  pathlib.Path(good).unlink()
  out = run_main(f'--workdir={root / "run"}', '--config.trainer=predict',
                 f'--config.predict.inputs={folder}')
  assert user_error(out.stderr) == ('error: None of the 2 file(s) of config.predict.inputs is an '
                                    'image that can be read.')


def test_the_progress_line_of_a_slow_prediction_counts_the_skipped_files(digits_run, capsys,
                                                                          monkeypatch):
  root, config = digits_run
  monkeypatch.setattr(progress, 'SLOW_SECONDS', 0.0)  # Say the phase however quick it is.
  folder = root / 'counted'
  good = _photos(folder, sizes=((8, 8), (8, 8)))
  (folder / 'empty.png').write_bytes(b'')
  model = config_lib.build_model(config.model, num_classes=10)
  params, _ = checkpointing.restore_params(str(root / 'run'))
  predicted, probabilities = prediction.predict_files(
      model, params, [*good, str(folder / 'empty.png')], config.data, batch_size=2)
  assert predicted == good and probabilities.shape == (2, 10)
  last = capsys.readouterr().err.splitlines()[-1]
  assert last.startswith('Predicting 3 image(s): 2 of 3 images predicted, 1 skipped in '), last


def test_a_corrupt_class_names_file_is_one_line_and_training_writes_it_anew(tmp_path):
  (tmp_path / 'class_names.json').write_text('["a", ')  # Cut short.
  with pytest.raises(errors.BadFileError, match=r'class_names\.json is not valid JSON .*; '
                                                r'delete it to show class indices'):
    class_names.load(str(tmp_path))
  class_names.save(str(tmp_path), ['cat', 'dog'])
  assert class_names.load(str(tmp_path)) == ('cat', 'dog')


def test_a_run_trained_with_imagenet_statistics_predicts_with_them(digits_run, tmp_path,
                                                                     capsys):
  root, config = digits_run
  workdir = tmp_path / 'imagenet'
  shutil.copytree(root / 'run', workdir)
  saved = json.loads((workdir / 'config.json').read_text())
  saved['data'].update(pixel_mean=list(normalization.IMAGENET_MEAN),
                       pixel_std=list(normalization.IMAGENET_STD))
  (workdir / 'config.json').write_text(json.dumps(saved))
  photo = _photos(tmp_path / 'photos', sizes=((8, 8),))[0]
  out = run_main(f'--workdir={workdir}', '--config.trainer=predict',
                 f'--config.predict.inputs={photo}', '--config.predict.top_k=10',
                 f'--config.predict.output_file={tmp_path}/p.jsonl')
  assert out.returncode == 0, out.stderr
  assert 'note:' not in out.stderr
  got = {p['class']: p['probability']
         for p in json.loads((tmp_path / 'p.jsonl').read_text())['predictions']}
  model = config_lib.build_model(config.model, num_classes=10)
  params, _ = checkpointing.restore_params(str(workdir))
  inputs = (np.asarray(Image.open(photo)) / 255 - normalization.IMAGENET_MEAN) / (
      normalization.IMAGENET_STD)
  want = jax.nn.softmax(model.apply({'params': params}, inputs[None].astype(np.float32)))[0]
  np.testing.assert_allclose([got[c] for c in range(10)], want, atol=1e-4)
  # A --config file that normalizes otherwise is said, on stderr.
  mismatched = override(config_lib.classification_config('ViT-testing'), {
      'model.patch_size': (4, 4), 'data.image_size': 8, 'trainer': 'predict',
      'predict.inputs': photo})
  main.run(mismatched, str(workdir))
  assert (f'note: --workdir={workdir} was trained with config.data.pixel_mean=(0.485, 0.456, '
          '0.406) and pixel_std=(0.229, 0.224, 0.225); this run normalizes its images with (0.5, '
          "0.5, 0.5) and (0.5, 0.5, 0.5): to take the run's, leave --config out, or set "
          '--config.data.pixel_mean and pixel_std.\n') in capsys.readouterr().err
  # Fine-tuning from that run's workdir with another config's statistics is said too.
  main.run(override(mismatched, {'trainer': 'train', 'pretrained': str(workdir),
                                 'total_steps': 1, 'eval_every': 0}), str(tmp_path / 'tuned'))
  assert (f'note: config.pretrained={workdir} was trained with config.data.pixel_mean=(0.485, '
          "0.456, 0.406)") in capsys.readouterr().err
