"""Tests for the extra evaluations (vit_jax.evaluation): hand-made TFDS ImageNet variants whose
figures are known in advance, few-shot probes on digits against scikit-learn, config errors, and
2 devices against 1."""

import contextlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import errors, evaluation
from vit_jax.data import eval_sets, images
from vit_jax.data.hosts import host_range
from vit_jax.evaluation import fewshot
from vit_jax.train import mesh as mesh_lib
from helpers import slowly

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = {'image_size': 4}  # Hand-made images are 4x4: eval preprocessing keeps their pixels.
DIGITS = {'channels': 1, 'image_size': 8}  # Few-shot features: digits' 64 pixels.
BATCH = 4
NO_CLASS = 0  # In an image's third channel: no distractor.

# Each image says what the fake model predicts: class p = R + 256 * G of its pixels, scored 10;
# B > 0 adds class B - 1 scored 20 (a distractor outside ImageNet-A/R's subsets).
# (real label set | label, predicted class, distractor class or None)
REAL = [([1, 2], 2), ([3], 3), ([], 9), ([4, 5], 9), ([6], 0), ([7, 8], 8)]  # 3 of 5 counted.
V2 = [(3, 3), (4, 4), (5, 6), (999, 999)]  # 3 of 4.
SKETCH = [(10, 10), (500, 11), (998, 998)]  # 2 of 3.
A = [(7, 7), (300, 300), (999, 7), (7, 999), (300, 300)]  # Subset {7, 300, 999}: 3 of 5.
R = [(5, 5), (600, 5), (600, 600), (640, 640)]  # Subset {5, 600, 640}: 3 of 4.
DISTRACTOR = 1  # Class 1 occurs in neither A's nor R's labels, and wins the plain argmax.
EXPECTED = {'imagenet2012_real_accuracy': 3 / 5, 'imagenet_v2_accuracy': 3 / 4,
            'imagenet_sketch_accuracy': 2 / 3, 'imagenet_a_accuracy': 3 / 5,
            'imagenet_r_accuracy': 3 / 4}
# Few-shot probes on digits' pixels (360 test images; chance 10%), l2_reg 2**10, seed 0.
FEWSHOT_CORRECT = {1: 208, 5: 275, 10: 304, 25: 319}


def _image(predicted: int, distractor: int | None = None) -> np.ndarray:
  pixel = [predicted % 256, predicted // 256, NO_CLASS if distractor is None else distractor + 1]
  return np.broadcast_to(np.array(pixel, np.uint8), (4, 4, 3)).copy()


def _examples(name: str) -> list[dict]:
  if name == 'imagenet2012_real':
    return [{'image': _image(p), 'real_label': np.array(labels, np.int64)} for labels, p in REAL]
  rows = {'imagenet_v2': V2, 'imagenet_sketch': SKETCH, 'imagenet_a': A, 'imagenet_r': R}[name]
  distractor = DISTRACTOR if name in ('imagenet_a', 'imagenet_r') else None
  return [{'image': _image(p, distractor), 'label': np.int64(label)} for label, p in rows]


def _as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
  """The hand-made examples of `self.name`, or one host's share of them (an even split)."""
  del decoders, read_config, shuffle_files  # Images come decoded; readers only need labels then.
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  examples = _examples(self.name)
  start, stop = 0, len(examples)
  if not isinstance(split, str):  # tfds.split_for_jax_process's share, an _EvenSplit.
    start, stop = host_range(len(examples), split.index, split.count)
  share = examples[start:stop]
  signature = {'image': tf.TensorSpec((4, 4, 3), tf.uint8)}
  label_key = 'real_label' if self.name == 'imagenet2012_real' else 'label'
  signature[label_key] = tf.TensorSpec((None,) if label_key == 'real_label' else (), tf.int64)
  dataset = tf.data.Dataset.from_generator(lambda: iter(share), output_signature=signature)
  return dataset.apply(tf.data.experimental.assert_cardinality(len(share)))


@contextlib.contextmanager
def mock_imagenet():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(as_dataset_fn=_as_dataset):
    yield


@jax.jit
def logits_fn(images_batch):
  """Reads the predicted (score 10) and distractor (score 20) classes back from the pixels."""
  pixels = jnp.round((images_batch[:, 0, 0, :] + 1.0) * 127.5).astype(jnp.int32)
  predicted = pixels[:, 0] + 256 * pixels[:, 1]
  distractor = jax.nn.one_hot(pixels[:, 2] - 1, 1000) * (pixels[:, 2] != NO_CLASS)[:, None]
  return 10.0 * jax.nn.one_hot(predicted, 1000) + 20.0 * distractor


@jax.jit
def pixels_fn(images_batch):
  return images_batch.reshape(images_batch.shape[0], -1)


def all_figures() -> dict[str, float]:
  """Every evaluation once on the mocked ImageNet variants and digits, on all devices here."""
  mesh = mesh_lib.make_mesh()
  with mock_imagenet():
    imagenet = evaluation.build(evaluation.EVALS[:-1], DATA, None, num_classes=1000)
    figures = evaluation.run(imagenet, logits_fn, pixels_fn, mesh, BATCH)
  few = evaluation.build(('fewshot',), DIGITS, None, num_classes=10)
  figures.update(evaluation.run(few, logits_fn, pixels_fn, mesh, 64))
  return figures


@pytest.fixture(scope='module')
def figures():
  return all_figures()


# ------------------------------------------------------------------------------ ImageNet variants


def test_imagenet_variants_give_the_known_figures(figures):
  for name, expected in EXPECTED.items():
    assert figures[name] == pytest.approx(expected, abs=1e-7), name
    print(f'{name}: {figures[name]:.4f} (known in advance: {expected:.4f})')


def test_subsets_are_the_classes_in_the_split_and_plain_argmax_would_miss_them():
  mesh = mesh_lib.make_mesh()
  with mock_imagenet():
    a, r, v2 = evaluation.build(('imagenet_a', 'imagenet_r', 'imagenet_v2'), DATA, None, 1000)
    assert a.classes().tolist() == [7, 300, 999] and r.classes().tolist() == [5, 600, 640]
    assert v2.classes().tolist() == list(range(1000))
    batch = next(a.split.batches(8))
    plain = np.argmax(logits_fn(mesh_lib.global_batch(batch, mesh)['image']), -1)
    assert set(plain[batch['mask'] > 0].tolist()) == {DISTRACTOR}


def test_eval_split_shares_cover_the_split_once_with_padded_batches():
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  data_config = images.default_config()
  data_config.image_size = 4
  labels, masks = [], []
  with mock_imagenet():
    for index in range(2):  # 5 examples over 2 hosts: 3 and 2, both in 2 batches of 2.
      split = eval_sets.open_split('imagenet_a', 'test', data_config,
                                   lambda ex: {'label': tf.cast(ex['label'], tf.int32)},
                                   ('label',), process_index=index, process_count=2)
      assert (split.num_examples, split.local_num_examples) == (5, 3 - index)
      assert split.num_batches(2) == 2
      batches = list(split.batches(2))
      assert len(batches) == 2 and batches[0]['image'].shape == (2, 4, 4, 3)
      labels += [label for b in batches for label in b['label'].tolist()]
      masks += [mask for b in batches for mask in b['mask'].tolist()]
  assert masks == [1, 1, 1, 0, 1, 1, 0, 0]
  assert [label for label, mask in zip(labels, masks) if mask] == [label for label, _ in A]


class SlowFn:
  """A slow `fn`; records how many of its earlier outputs had not finished at each call."""

  def __init__(self, fn):
    self.fn, self.outputs, self.unfinished_at_call = fn, [], []

  def __call__(self, images_batch):
    self.unfinished_at_call.append(sum(not out.is_ready() for out in self.outputs))
    self.outputs.append(slowly(self.fn(images_batch)))
    return self.outputs[-1]


@pytest.mark.parametrize('in_flight, most_unfinished', [(1, 0), (2, 1)])
def test_imagenet_variants_queue_at_most_in_flight_batches(in_flight, most_unfinished):
  slow = SlowFn(logits_fn)
  with mock_imagenet():
    [a] = evaluation.build(('imagenet_a',), DATA, None, num_classes=1000)
    figures = evaluation.run([a], slow, pixels_fn, mesh_lib.make_mesh(), 1, in_flight)
  assert figures == {'imagenet_a_accuracy': pytest.approx(EXPECTED['imagenet_a_accuracy'])}
  assert len(slow.unfinished_at_call) == len(A)  # Batches of 1.
  assert max(slow.unfinished_at_call) == most_unfinished


def test_imagenet_variants_with_no_limit_run_ahead_of_the_device():
  slow = SlowFn(logits_fn)
  with mock_imagenet():
    [a] = evaluation.build(('imagenet_a',), DATA, None, num_classes=1000)
    evaluation.run([a], slow, pixels_fn, mesh_lib.make_mesh(), 1, None)
  assert max(slow.unfinished_at_call) > 1


# ------------------------------------------------------------------------------ Few-shot


def test_fewshot_figures_on_digits_pixels(figures):
  for shots, correct in FEWSHOT_CORRECT.items():
    assert figures[f'fewshot_digits_{shots}shot'] == pytest.approx(correct / 360, abs=1e-9)
    print(f'fewshot_digits_{shots}shot on pixels: {figures[f"fewshot_digits_{shots}shot"]:.4f} '
          '(chance 0.1)')
  assert figures['fewshot_digits_1shot'] > 0.5 and figures['fewshot_digits_25shot'] > 0.85


def test_fewshot_probe_is_sklearns_ridge_solution():
  from sklearn import linear_model  # pylint: disable=g-import-not-at-top
  [evaluator] = evaluation.build(('fewshot',), DIGITS, {'shots': (1, 10)}, num_classes=10)
  mesh = mesh_lib.make_mesh()
  train_x, train_y = evaluator.features('train_split', pixels_fn, mesh, 64)
  test_x, test_y = evaluator.features('test_split', pixels_fn, mesh, 64)
  assert train_x.shape == (1437, 64) and test_x.shape == (360, 64)
  figures = evaluator.evaluate(None, pixels_fn, mesh, 64)
  l2_reg = evaluator.config.l2_reg
  for shots in (1, 10):
    picks = fewshot.pick_shots(train_y, shots, 10, seed=0)
    assert np.bincount(train_y[picks]).tolist() == [shots] * 10
    x, y = train_x[picks], train_y[picks]
    mean, std = x.mean(0), x.std(0) + fewshot.STD_EPS
    ridge = linear_model.Ridge(alpha=l2_reg, fit_intercept=False)
    ridge.fit((x - mean) / std, 2.0 * np.eye(10)[y] - 1.0)
    probe = fewshot.fit_probe(x, y, 10, l2_reg)
    np.testing.assert_allclose(probe.weights, ridge.coef_.T, rtol=1e-6, atol=1e-12)
    sklearn_accuracy = np.mean(np.argmax(ridge.predict((test_x - mean) / std), -1) == test_y)
    assert figures[f'fewshot_digits_{shots}shot'] == sklearn_accuracy
    print(f'{shots}-shot on digits pixels: ours {figures[f"fewshot_digits_{shots}shot"]:.4f}, '
          f'scikit-learn Ridge {sklearn_accuracy:.4f}; weights max |diff| '
          f'{np.abs(probe.weights - ridge.coef_.T).max():.1e}')
  assert fewshot.pick_shots(train_y, 10, 10, seed=0)[::10].tolist() == (
      fewshot.pick_shots(train_y, 1, 10, seed=0).tolist())  # 10 shots keep the 1-shot picks.


@pytest.mark.parametrize('in_flight, most_unfinished', [(1, 0), (None, 1)])
def test_fewshot_features_queue_at_most_in_flight_batches(in_flight, most_unfinished):
  # None: fetched one batch late, so at most one earlier batch still runs.
  [evaluator] = evaluation.build(('fewshot',), DIGITS, {'shots': (1,)}, num_classes=10)
  slow = SlowFn(pixels_fn)
  features, labels = evaluator.features('test_split', slow, mesh_lib.make_mesh(), 64, in_flight)
  assert features.shape == (360, 64) and labels.shape == (360,)
  assert len(slow.unfinished_at_call) == 6  # 360 digits in batches of 64.
  assert max(slow.unfinished_at_call) == most_unfinished


def test_fewshot_with_more_shots_than_a_class_has_is_a_one_line_error():
  [evaluator] = evaluation.build(('fewshot',), DIGITS, {'shots': (5, 200)}, num_classes=10)
  with pytest.raises(errors.ConfigError, match=r'shots=200: class \d has 1\d\d examples') as e:
    evaluator.evaluate(None, pixels_fn, mesh_lib.make_mesh(), 64)
  assert '\n' not in str(e.value)


# ------------------------------------------------------------------------------ Config errors


@pytest.mark.parametrize('names, num_classes, message', [
    (('imagenet_c',), 1000, r"Unknown extra evaluation 'imagenet_c' .* known ones are"),
    (('fewshot', 'fewshot'), 10, r"'fewshot' is listed more than once"),
    (('imagenet_v2',), 10, r"'imagenet_v2' scores the 1,000 ImageNet classes, but the model has "
                           r'num_classes=10'),
    ('fewshot', 10, r'must be a tuple of names'),
])
def test_bad_names_are_one_line_config_errors(names, num_classes, message):
  with pytest.raises(errors.ConfigError, match=message) as e:
    evaluation.build(names, DIGITS, None, num_classes)
  assert '\n' not in str(e.value)


def test_bad_fewshot_config_is_a_config_error():
  with pytest.raises(errors.ConfigError, match=r'shots=\(0, 5\) \(expected distinct ints > 0'):
    evaluation.build(('fewshot',), DIGITS, {'shots': (0, 5)}, 10)
  with pytest.raises(errors.ConfigError, match=r"fewshot config dataset='digits', "
                                               r"split='validation'\): config.test_split="):
    evaluation.build(('fewshot',), DIGITS, {'test_split': 'validation'}, 10)


# ------------------------------------------------------------------------------ Devices

TWO_DEVICES = '''
import json, os, sys
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=2')
sys.path.insert(0, os.path.join(sys.argv[1], 'tests'))
import vit_jax.evaluation
assert 'tensorflow' not in sys.modules, 'importing vit_jax.evaluation imported TensorFlow'
import jax
assert jax.device_count() == 2
import test_evaluation
print(json.dumps(test_evaluation.all_figures()))
'''


def test_two_devices_give_the_figures_of_one(figures):
  assert jax.device_count() == 1
  run = subprocess.run([sys.executable, '-c', TWO_DEVICES, REPO], capture_output=True, text=True,
                       env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert json.loads(run.stdout.strip().splitlines()[-1]) == figures


def test_names_come_as_a_tuple_a_list_or_one_comma_separated_string():
  # --config.evals=a,b reaches the config as ('a,b',); --config.evals="['a', 'b']" as a list.
  assert evaluation.names_of(('fewshot,imagenet_v2',)) == ('fewshot', 'imagenet_v2')
  assert evaluation.names_of(['fewshot', ' imagenet_a']) == ('fewshot', 'imagenet_a')
  assert evaluation.names_of(()) == ()


def test_fewshot_settings_without_the_fewshot_evaluation_are_an_error(tmp_path):
  from vit_jax.train import classification, config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.classification_config('ViT-testing')
  config.fewshot.shots = (2,)
  with pytest.raises(errors.ConfigError, match="config.fewshot is set but config.evals=\\(\\) "
                     "has no 'fewshot'"):
    classification.ClassificationTask(config, str(tmp_path))
