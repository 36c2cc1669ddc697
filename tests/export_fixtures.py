"""What test_export.py and test_export_cli.py export, built once per worker (one worker runs
both modules: their xdist_group), and how they run an artifact. Loaded by conftest.py."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import override
from PIL import Image

WORKDIR_MODELS = {'ViT-testing': 4, 'R+ViT-testing': 1, 'DeiT-testing': 4}  # name -> patch.
SOURCES = [*WORKDIR_MODELS, 'npz']
IMAGE_SIZE = 8
EVAL_RESIZE_RATIO = 1.25  # Preprocessing resizes to 10x10 and crops the central 8x8.
PREPROCESS_TOLERANCE = 1e-5  # Probabilities; the resized pixels equal TF's (see test output).


def tiny_config(name: str):
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.classification_config(name)
  config.model.patch_size = (WORKDIR_MODELS[name],) * 2
  return override(config, {'data.image_size': IMAGE_SIZE, 'data.eval_resize_ratio':
                           EVAL_RESIZE_RATIO, 'batch_size': 32, 'eval_batch_size': 360,
                           'total_steps': 1, 'optimizer.learning_rate': 0.1, 'log_every': 1,
                           'eval_every': 0, 'checkpoint_every': 0})


@pytest.fixture(scope='session')
def sources(tmp_path_factory):
  """name -> (path, reference JAX model, its params, model name) for each SOURCE: a workdir
  trained on digits for each of WORKDIR_MODELS, and a published-layout .npz ('npz')."""
  # pylint: disable-next=g-import-not-at-top
  from vit_jax import main, models, weights
  from vit_jax.train import prediction  # pylint: disable=g-import-not-at-top
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


@pytest.fixture(scope='session')
def image_files(tmp_path_factory):
  """Two PNGs of other sizes than the model's: 13x21 and 8x8."""
  root = tmp_path_factory.mktemp('images')
  paths = []
  for index, (height, width) in enumerate([(13, 21), (8, 8)]):
    pixels = np.random.RandomState(index).randint(0, 256, (height, width, 3)).astype(np.uint8)
    paths.append(str(root / f'image{index}.png'))
    Image.fromarray(pixels).save(paths[-1])
  return paths


def run_artifact(artifact_dir: str, export_format: str, images: np.ndarray) -> dict:
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


def assert_equals_predict(artifact_dir: str, export_format: str, pictures, want, what: str):
  """The artifact's probabilities on each picture file, uint8 as it is, equal predict's."""
  for path, expected in zip(pictures, want):
    pixels = np.asarray(Image.open(path))[None]
    got = run_artifact(artifact_dir, export_format, pixels)['probabilities'][0]
    print(f'{export_format} {what} {pixels.shape[1]}x{pixels.shape[2]}: max '
          f'|probabilities - predict| {np.abs(got - expected).max():.1e}')
    np.testing.assert_allclose(got, expected, atol=PREPROCESS_TOLERANCE)
