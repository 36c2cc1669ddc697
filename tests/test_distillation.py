"""DeiT distillation as the paper defines it: 'none', 'hard' and 'soft', on digits.

The soft loss against a hand computation, the task's loss against the formula on the model's
own outputs, lambda 0 against plain training, and a teacher that always answers 3.
"""

import json
import pathlib

import jax
import numpy as np
import pytest
from helpers import digits_config, override, read_metrics

from vit_jax import errors, main, models, weights
from vit_jax.data import images, normalization
from vit_jax.train import classification, config as config_lib, losses

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('distillation')


def _softmax(z):
  z = np.exp(z - z.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


@pytest.mark.parametrize('temperature', [1.0, 3.0])
def test_soft_distillation_is_tau_squared_kl_of_the_softened_outputs(temperature):
  student = np.array([[2.0, -1.0, 0.5, 0.0], [0.0, 0.0, 3.0, -2.0]], np.float32)
  teacher = np.array([[1.0, 0.0, 0.0, 4.0], [-1.0, 2.0, 2.0, 0.5]], np.float32)
  p_teacher = _softmax(teacher.astype(np.float64) / temperature)
  p_student = _softmax(student.astype(np.float64) / temperature)
  expected = temperature**2 * np.sum(p_teacher * np.log(p_teacher / p_student), axis=-1)
  got = losses.soft_distillation(student, teacher, temperature)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  assert got.shape == (2,) and np.all(got > 0.1)
  np.testing.assert_allclose(losses.soft_distillation(teacher, teacher, temperature), 0,
                             atol=1e-6)


def deit_config(**overrides):
  return digits_config('DeiT-testing', **overrides)


@pytest.fixture(scope='module')
def always_3(tmp_path_factory):
  """A teacher workdir whose top class is 3 for every image: all weights 0 but the head bias."""
  tmp = tmp_path_factory.mktemp('teacher')
  model = models.get_model('ViT-testing', num_classes=10, patch_size=(4, 4))
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(1), np.zeros((1, 8, 8, 3)))
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes['params'])
  params['head']['bias'][3] = 10.0
  npz = str(tmp / 'always_3.npz')
  weights.save_npz(npz, params)
  workdir = str(tmp / 'workdir')
  config = config_lib.classification_config('ViT-testing')
  config.model.patch_size = (4, 4)
  config.data.image_size = 8
  main.run(override(config, {'pretrained': npz, 'total_steps': 1, 'batch_size': 32,
                             'eval_batch_size': 360, 'optimizer.learning_rate': 0.0,
                             'eval_every': 0, 'checkpoint_every': 0}), workdir)
  return {'workdir': workdir, 'npz': npz}


@pytest.mark.parametrize('mode, temperature', [('none', 1.0), ('hard', 1.0), ('soft', 3.0)])
def test_the_loss_is_the_deit_formula_on_the_models_outputs(always_3, tmp_path, mode,
                                                            temperature):
  config = deit_config(distillation=mode, distillation_temperature=temperature,
                       distillation_weight=0.3, label_smoothing=0.1,
                       teacher='' if mode == 'none' else always_3['workdir'])
  task = classification.ClassificationTask(config, str(tmp_path))
  params = jax.jit(task.init_params)(jax.random.PRNGKey(0))
  params = jax.tree.map(lambda p: p + 0.05 * np.random.default_rng(0).standard_normal(p.shape)
                        .astype(p.dtype), params)  # The zero-initialised heads answer.
  batch = next(task.train_batches(0))
  rng = jax.random.PRNGKey(5)
  loss, metrics = task.loss(params, batch, rng, task.frozen_params())
  logits, logits_dist = task.model.apply({'params': params}, batch['image'], train=True,
                                         rngs={'dropout': rng})
  class_loss = losses.cross_entropy(logits, batch['label'], 0.1).mean()
  if mode == 'none':  # The labels, smoothed as for the class token.
    dist_loss = losses.cross_entropy(logits_dist, batch['label'], 0.1).mean()
  elif mode == 'hard':  # The teacher's class 3, not smoothed.
    dist_loss = losses.cross_entropy(logits_dist, np.full(32, 3)).mean()
  else:
    teacher_logits = np.zeros((32, 10), np.float32)
    teacher_logits[:, 3] = 10.0
    dist_loss = losses.soft_distillation(logits_dist, teacher_logits, temperature).mean()
  np.testing.assert_allclose(metrics['class_loss'], class_loss, rtol=1e-5)
  np.testing.assert_allclose(metrics['dist_loss'], dist_loss, rtol=1e-5)
  np.testing.assert_allclose(loss, 0.7 * class_loss + 0.3 * dist_loss, rtol=1e-5)


def test_with_weight_0_the_teacher_changes_nothing(always_3, tmp_path):
  # lambda 0: only the class token's loss counts, so soft distillation from any teacher trains
  # as plain training ('none', lambda 0) does, step for step.
  runs = {}
  for mode in ('none', 'soft'):
    workdir = str(tmp_path / mode)
    main.run(deit_config(distillation=mode, distillation_weight=0.0,
                         teacher=always_3['workdir'] if mode == 'soft' else ''), workdir)
    runs[mode] = [row['loss'] for row in read_metrics(workdir, 'train')]
  assert len(runs['soft']) == 20
  np.testing.assert_allclose(runs['soft'], runs['none'], rtol=1e-6)
  print(f"lambda 0, steps 1-3 and 20: soft {np.round(runs['soft'][:3] + runs['soft'][-1:], 7)}, "
        f"none {np.round(runs['none'][:3] + runs['none'][-1:], 7)}; max |diff| over 20 steps "
        f"{np.abs(np.subtract(runs['soft'], runs['none'])).max():.1e}")


@pytest.mark.parametrize('mode', ['hard', 'soft'])
def test_a_teacher_that_always_answers_3_teaches_the_distillation_head(always_3, tmp_path, mode):
  # The labels are 3 for a tenth of the digits: only the teacher can teach the distillation
  # head to answer 3 for nearly all of them.
  config = deit_config(distillation=mode, teacher=always_3['workdir'], log_every=5,
                       total_steps=40, **{'optimizer.learning_rate': 3e-3})
  student = str(tmp_path / 'student')
  results = main.run(config, student)
  rows = read_metrics(student, 'train')
  # The teacher's one class is learnt far faster than the digits; were the labels the
  # distillation targets, the two losses would be alike.
  assert rows[-1]['dist_loss'] < rows[-1]['class_loss'] - 0.3, rows[-1]
  test = next(iter(images.build(config.data).eval_batches(360)))
  share_of_3 = np.mean(test['label'] == 3)
  assert share_of_3 < 0.2
  # Evaluation reports each head and their mean; the distillation head says 3 (~all right on
  # the 3s, wrong elsewhere), the class head has learnt some digits.
  assert results['distillation_head_accuracy'] == pytest.approx(share_of_3, abs=0.02)
  assert results['class_head_accuracy'] > share_of_3 + 0.1
  assert {'accuracy', 'class_head_accuracy', 'distillation_head_accuracy'} <= set(results)


def test_soft_distillation_from_a_hybrid_teacher_in_a_published_npz(always_3, tmp_path):
  # A hybrid ResNet+ViT teacher (the convolutional bias DeiT wants), stored as a published-
  # layout .npz: its own init, with a head that answers 3 for every image.
  teacher_model = models.get_model('R+ViT-testing', num_classes=10)
  params = jax.tree.map(np.array, jax.jit(teacher_model.init)(jax.random.PRNGKey(2),
                                                              np.zeros((1, 8, 8, 3)))['params'])
  params['head']['bias'][3] = 10.0
  npz = str(tmp_path / 'hybrid.npz')
  weights.save_npz(npz, params)
  with pytest.raises(errors.ConfigError, match='set config.teacher_model'):
    main.run(deit_config(distillation='soft', teacher=npz), str(tmp_path / 'a'))
  config = deit_config(distillation='soft', teacher=npz, teacher_model='R+ViT-testing',
                       total_steps=10, **{'optimizer.learning_rate': 3e-3})
  main.run(config, str(tmp_path / 'b'))
  rows = read_metrics(str(tmp_path / 'b'), 'train')
  assert rows[-1]['dist_loss'] < rows[0]['dist_loss'] - 0.5  # It learns the teacher's 3.
  assert rows[-1]['dist_loss'] < rows[-1]['class_loss'] - 0.5


def test_a_workdir_teacher_sees_the_batch_normalized_as_its_own_run_did(tmp_path):
  # DeiT's student takes ImageNet's pixel statistics; a teacher fine-tuned from Google's weights
  # took [-1, 1]. The teacher must see each batch in its own statistics.
  model = models.get_model('ViT-testing', num_classes=10, patch_size=(4, 4))
  params = jax.jit(model.init)(jax.random.PRNGKey(3), np.zeros((1, 8, 8, 3)))['params']
  noise = np.random.default_rng(3)
  params = jax.tree.map(lambda p: np.asarray(p) + 0.5 * noise.standard_normal(p.shape).astype(
      p.dtype), params)  # An input-dependent teacher.
  npz = str(tmp_path / 'teacher.npz')
  weights.save_npz(npz, params)
  teacher = str(tmp_path / 'teacher')
  main.run(digits_config(pretrained=npz, total_steps=1, **{'optimizer.learning_rate': 0.0}),
           teacher)
  mean, std = np.array(normalization.IMAGENET_MEAN), np.array(normalization.IMAGENET_STD)
  config = deit_config(distillation='soft', teacher=teacher,
                       **{'data.pixel_mean': tuple(mean), 'data.pixel_std': tuple(std)})
  task = classification.ClassificationTask(config, str(tmp_path / 'student'))
  student = jax.jit(task.init_params)(jax.random.PRNGKey(0))
  batch = next(task.train_batches(0))
  rng = jax.random.PRNGKey(5)
  _, metrics = task.loss(student, batch, rng, task.frozen_params())
  _, logits_dist = task.model.apply({'params': student}, batch['image'], train=True,
                                    rngs={'dropout': rng})
  teacher_inputs = ((batch['image'] * std + mean) - 0.5) / 0.5  # The same pixels in [-1, 1].
  assert teacher_inputs.min() == pytest.approx(-1, abs=1e-5)
  def dist_loss(inputs):
    logits = model.apply({'params': params}, inputs.astype(np.float32))
    return float(losses.soft_distillation(logits_dist, logits, 1.0).mean())
  np.testing.assert_allclose(metrics['dist_loss'], dist_loss(teacher_inputs), rtol=1e-4)
  assert abs(dist_loss(batch['image']) - dist_loss(teacher_inputs)) > 1e-2

  # A teacher that learnt its classes in another order would teach shifted labels.
  (pathlib.Path(teacher) / 'class_names.json').write_text(
      json.dumps([str(d) for d in (1, 0, *range(2, 10))]))
  with pytest.raises(errors.ConfigError, match=r"does not label its classes as the teacher in "
                     r"\S+ learnt them .*label 0 is '0' in the data, '1' in the teacher\. Use a "
                     r'teacher trained on these classes\.'):
    classification.ClassificationTask(config, str(tmp_path / 'student'))


@pytest.mark.parametrize('overrides, message', [
    ({'teacher': 'runs/t'}, "distillation='none' trains the distillation token on the labels"),
    ({'distillation': 'hard'}, "config.distillation='hard' needs a teacher"),
    ({'distillation': 'kl'}, "Unknown config.distillation='kl'"),
    ({'distillation_weight': 1.5}, 'must be in \\[0, 1\\]'),
    ({'distillation_temperature': 2.0}, "applies to distillation='soft' only"),
])
def test_distillation_settings_that_do_not_fit_are_one_line_errors(tmp_path, overrides, message):
  with pytest.raises(errors.ConfigError, match=message):
    classification.ClassificationTask(deit_config(**overrides), str(tmp_path))


def test_a_model_without_a_distillation_head_refuses_distillation(tmp_path):
  config = deit_config(distillation='hard', teacher='runs/t')
  config.model = config_lib.model_config('ViT-testing')
  with pytest.raises(errors.ConfigError, match='config.teacher, config.distillation is set but '
                     'model ViT-testing has no distillation head'):
    classification.ClassificationTask(config, str(tmp_path))


def test_an_old_config_with_a_teacher_reads_as_hard_distillation():
  saved = {'task': 'classification', 'model': {'name': 'DeiT-testing'}, 'teacher': 'runs/t'}
  assert config_lib.from_saved(saved, 'config.json').distillation == 'hard'
