"""The EMA of the weights: the recurrence, checkpoints, resume, evaluation and its readers."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image
from helpers import REPO, digits_command, digits_config, override, user_error

from vit_jax import errors, main, weights
from vit_jax.train import checkpointing, classification, ema


def tiny_config(**overrides):
  return digits_config(**{'optimizer.learning_rate': 3e-3, 'ema_decay': 0.9, **overrides})


def test_the_warmed_up_decay_follows_tensorflows_num_updates_rule():
  steps = np.arange(1, 6)
  np.testing.assert_allclose(ema.decay_at(steps, 0.9, warmup=True),
                             np.minimum(0.9, (1 + steps) / (10 + steps)), rtol=1e-6)
  assert float(ema.decay_at(100, 0.9, warmup=True)) == pytest.approx(0.9)
  assert float(ema.decay_at(1, 0.9999, warmup=False)) == pytest.approx(0.9999)


def test_the_checkpointed_ema_equals_a_numpy_recurrence_over_20_steps(tmp_path):
  workdir = str(tmp_path / 'run')
  config = tiny_config(checkpoint_every=1, keep_checkpoints=20)
  main.run(config, workdir)
  task = classification.ClassificationTask(config, workdir)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  worst = 0.0
  average = {name: np.float64(value) for name, value in weights.flatten_params(
      jax.device_get(jax.jit(task.init_params)(params_rng))).items()}  # It starts as the init.
  with checkpointing.Checkpointer(workdir, keep=20) as checkpointer:
    for step in range(1, 21):
      params = weights.flatten_params(checkpointer.restore_params(step)[0])
      stored = weights.flatten_params(checkpointer.restore_params(step, item='ema_params')[0])
      decay = min(0.9, (1 + step) / (10 + step))  # Warmed up: 0.18 at step 1, 0.9 from 80.
      average = {name: decay * average[name] + (1 - decay) * params[name] for name in params}
      for name, value in average.items():
        np.testing.assert_allclose(stored[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
        worst = max(worst, float(np.abs(stored[name] - value).max()))
  print(f'EMA against the float64 numpy recurrence, steps 1-20, every parameter: max |diff| '
        f'{worst:.1e}')
  # The average lags the weights: after 20 steps it is between the init and the weights.
  moved = np.abs(params['head/kernel']).max()
  assert 0 < np.abs(stored['head/kernel']).max() < moved


def test_the_ema_survives_a_resume_bit_for_bit(tmp_path):
  config = tiny_config(checkpoint_every=10, keep_checkpoints=5,
                       **{'model.dropout_rate': 0.1})
  uninterrupted, interrupted = str(tmp_path / 'uninterrupted'), str(tmp_path / 'interrupted')
  main.run(config, uninterrupted)
  main.run(config, interrupted)
  shutil.rmtree(os.path.join(interrupted, 'checkpoints', '20'))  # As if killed after step 10.
  main.run(config, interrupted)
  for item in ('params', 'ema_params'):
    with checkpointing.Checkpointer(uninterrupted) as a, checkpointing.Checkpointer(
        interrupted) as b:
      want = weights.flatten_params(a.restore_params(20, item=item)[0])
      got = weights.flatten_params(b.restore_params(20, item=item)[0])
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=f'{item}/{name}')
    print(f'{item} at step 20, resumed from step 10: {len(want)} arrays bit-equal to the '
          'uninterrupted run')


def test_turning_ema_on_or_off_mid_run_resumes(tmp_path):
  workdir = str(tmp_path / 'run')
  main.run(tiny_config(ema_decay=0.0, total_steps=4, checkpoint_every=2), workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '4'))
  results = main.run(tiny_config(total_steps=4, checkpoint_every=2), workdir)  # EMA on.
  assert 'ema_accuracy' in results
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '4'))
  results = main.run(tiny_config(ema_decay=0.0, total_steps=4, checkpoint_every=2), workdir)
  assert 'ema_accuracy' not in results


def test_evaluation_reports_the_ema_beside_the_weights_and_readers_take_it(tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  results = main.run(tiny_config(ema_decay=0.99), workdir)
  assert {'accuracy', 'loss', 'ema_accuracy', 'ema_loss'} <= set(results)
  assert 'ema_num_examples' not in results
  # Decay 0.99 over 20 steps: the average is mostly the initial model.
  assert results['ema_loss'] != results['loss']
  again = main.run(override(tiny_config(ema_decay=0.99), {'trainer': 'evaluate'}), workdir)
  assert again == pytest.approx(results)
  # predict reads the EMA weights on request, and says so.
  image = tmp_path / 'digit.png'
  Image.fromarray(np.uint8(np.arange(64).reshape(8, 8) * 4)).save(image)
  for use_ema in (False, True):
    config = override(tiny_config(ema_decay=0.99), {'trainer': 'predict', 'use_ema': use_ema,
                                                    'predict.inputs': str(image)})
    main.run(config, workdir)
  printed = capsys.readouterr().out
  assert f'{os.path.join(workdir, "checkpoints")} at step 20 (EMA weights)' in printed
  params, _ = checkpointing.restore_params(workdir, ema=True)
  raw, _ = checkpointing.restore_params(workdir)
  assert not np.array_equal(params['head']['kernel'], raw['head']['kernel'])


def test_a_run_without_ema_has_no_ema_weights_to_read(tmp_path):
  workdir = str(tmp_path / 'run')
  main.run(tiny_config(ema_decay=0.0, total_steps=2), workdir)
  with pytest.raises(errors.ConfigError, match='has no EMA weights: the run was trained with '
                     'config.ema_decay=0'):
    checkpointing.restore_params(workdir, ema=True)


def test_a_digits_run_with_fewshot_and_ema_prints_every_figure_and_converts_the_ema(tmp_path):
  workdir = tmp_path / 'run'
  out = subprocess.run(digits_command(workdir, 4, '--config.ema_decay=0.999',
                                      "--config.evals=['fewshot']"), cwd=REPO,
                       capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr
  line = [row for row in out.stdout.splitlines() if row.startswith('eval at step 4')][0]
  names = [name for name in line.split(': ', 1)[1].split()[::2]]
  shots = [f'fewshot_digits_{k}shot' for k in (1, 5, 10, 25)]
  assert names == ['accuracy', 'loss', 'num_examples', *shots, 'ema_accuracy', 'ema_loss',
                   *[f'ema_{name}' for name in shots]], line
  logged = [json.loads(row) for row in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert set(names) <= set(logged[-1]), logged[-1]
  npz = tmp_path / 'ema.npz'
  out = subprocess.run([sys.executable, '-m', 'vit_jax.convert', str(workdir), str(npz), '--ema'],
                       cwd=REPO, capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr
  converted = weights.flatten_params(weights.load_npz(str(npz)))
  stored = weights.flatten_params(checkpointing.restore_params(str(workdir), ema=True)[0])
  np.testing.assert_array_equal(converted['head/kernel'], stored['head/kernel'])
  out = subprocess.run([sys.executable, '-m', 'vit_jax.convert', str(npz), str(tmp_path / 'x.npz'),
                        '--ema'], cwd=REPO, capture_output=True, text=True, check=False)
  assert 'holds one set of weights' in user_error(out.stderr)
  out = subprocess.run(digits_command(workdir, 4, '--config.use_ema=True'), cwd=REPO,
                       capture_output=True, text=True, check=False)
  assert "config.use_ema applies to trainer=predict/translate/visualize, not 'train'" in (
      user_error(out.stderr))
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['ema_decay'] == 0.999


@pytest.mark.parametrize('overrides, message', [
    ({'ema_decay': 1.0}, r'config.ema_decay=1.0 must be in \[0, 1\)'),
    ({'ema_decay': 0.0, 'ema_warmup': False}, 'config.ema_warmup=False applies to an EMA'),
    ({'trainer': 'evaluate', 'use_ema': True}, "config.use_ema applies to trainer=predict/"),
])
def test_ema_settings_that_do_not_apply_are_one_line_errors(tmp_path, overrides, message):
  with pytest.raises(errors.ConfigError, match=message):
    main.run(tiny_config(**overrides), str(tmp_path))
