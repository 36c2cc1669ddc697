"""dataset 'synthetic': ready-made random batches, and the trainer on them without TensorFlow."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, user_error

from vit_jax import errors
from vit_jax.data import images


SMALL = {'dataset': 'synthetic', 'image_size': 6, 'synthetic_classes': 7,
         'synthetic_train_examples': 50, 'synthetic_test_examples': 23}


def _build(process_index=0, process_count=1, **fields):
  return images.build({**SMALL, **fields}, process_index, process_count)


def test_batches_have_the_pipeline_shapes_and_resume_where_they_stopped():
  data = _build(channels=1)
  assert (data.num_classes, data.image_shape, data.num_train_examples) == (7, (6, 6, 1), 50)
  stream = data.train_batches(batch_size=4, seed=3)
  first = [next(stream) for _ in range(4)]
  assert first[0]['image'].shape == (4, 6, 6, 1) and first[0]['image'].dtype == np.float32
  assert first[0]['label'].dtype == np.int32 and set(first[0]['label']) <= set(range(7))
  assert -1 <= first[0]['image'].min() and first[0]['image'].max() < 1
  assert not np.array_equal(first[0]['image'], first[1]['image'])
  resumed = next(data.train_batches(batch_size=4, seed=3, start_step=3))
  np.testing.assert_array_equal(resumed['image'], first[3]['image'])
  np.testing.assert_array_equal(resumed['label'], first[3]['label'])


def test_eval_batches_cover_the_test_split_once_across_hosts():
  hosts = [_build(i, 2) for i in range(2)]
  counts = [data.num_eval_batches(5) for data in hosts]
  assert counts == [3, 3]  # 12 and 11 examples; every host runs as many batches.
  masks = [np.concatenate([b['mask'] for b in data.eval_batches(5)]) for data in hosts]
  assert [m.sum() for m in masks] == [12, 11]
  assert all(np.all(np.diff(m) <= 0) for m in masks)  # Padding only at the end.


@pytest.mark.parametrize('fields, message', [
    ({'dataset': 'digits'}, "Only dataset 'synthetic' reads config.data.synthetic_classes=7, "
     "synthetic_test_examples=23, synthetic_train_examples=50, and the dataset is 'digits'"),
    ({'mixup_alpha': 0.2}, 'batches, so mixup_alpha=0.2 cannot apply: leave it out.'),
    ({'cutmix_alpha': 1.0, 'random_erasing_prob': 0.25},
     'cutmix_alpha=1.0 and random_erasing_prob=0.25 cannot apply: leave them out.'),
    ({'repeated_augmentation': 3}, 'so repeated_augmentation=3 cannot apply: leave it out.'),
    ({'train_split': 'train[:98%]'}, "not 'train[:98%]' and 'test'"),
    ({'synthetic_test_examples': 0}, 'synthetic_test_examples=0: expected an int >= 1'),
])
def test_settings_synthetic_batches_cannot_honour_are_errors(fields, message):
  with pytest.raises(errors.ConfigError, match=re.escape(message)):
    _build(**fields)


def _without_tensorflow(tmp_path) -> dict:
  """An environment where `import tensorflow` (and tensorflow_datasets) fails as if absent."""
  for name in ('tensorflow', 'tensorflow_datasets'):
    package = tmp_path / 'no_tf' / name
    package.mkdir(parents=True)
    (package / '__init__.py').write_text(
        f'raise ModuleNotFoundError("No module named {name!r}", name={name!r})\n')
  return {'PYTHONPATH': str(tmp_path / 'no_tf')}


def test_trainer_runs_on_synthetic_batches_without_tensorflow(tmp_path):
  workdir = tmp_path / 'run'
  command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/vit.py:ViT-testing,synthetic',
             f'--workdir={workdir}', '--config.data.image_size=8', '--config.model.patch_size=4,4',
             '--config.batch_size=8', '--config.eval_batch_size=16', '--config.total_steps=6',
             '--config.log_every=3', '--config.eval_every=0', '--config.checkpoint_every=0',
             '--config.data.synthetic_classes=5', '--config.data.synthetic_test_examples=20']
  env = {**os.environ, **_without_tensorflow(tmp_path)}
  out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  assert 'step 6/6' in out.stdout and 'ex/s' in out.stdout and 'data wait' in out.stdout
  assert 'num_examples 20\n' in out.stdout
  metrics = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  train = [m for m in metrics if m['split'] == 'train']
  assert [m['step'] for m in train] == [3, 6] and 0 <= train[-1]['data_wait_fraction'] < 1
  assert (workdir / 'checkpoints' / '6').is_dir()

  # A setting that synthetic batches cannot honour ends the command in one line.
  bad = subprocess.run(command + ['--config.data.mixup_alpha=0.5'], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode != 0
  assert 'mixup_alpha=0.5' in user_error(bad.stderr)
