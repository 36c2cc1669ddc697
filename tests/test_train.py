"""The image trainer end to end on digits with a tiny ViT: train, resume, evaluate,
fine-tune, distil, accumulate, and the errors a user meets."""

import json
import logging
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_resumed_run_repeats, override, process_after, read_metrics

from vit_jax import errors, main, models, runtime, weights
from vit_jax.train import checkpointing, classification
from vit_jax.train import config as config_lib
from vit_jax.train import divergence, loop, optim
from vit_jax.train import mesh as mesh_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**overrides):
  config = config_lib.classification_config('ViT-testing')
  config.model.patch_size = (4, 4)  # 8x8 digits -> 4 patches.
  config.model.dropout_rate = 0.0
  config.data.dataset = 'digits'
  config.data.image_size = 8
  config.batch_size = 32
  config.eval_batch_size = 64  # 360 test digits: 5 full batches and a partial one.
  config.total_steps = 20
  config.optimizer.learning_rate = 1e-3
  config.log_every = 5
  config.eval_every = 10
  config.checkpoint_every = 10
  return override(config, overrides)


def test_train_writes_metrics_checkpoints_and_resumes(tmp_path):
  workdir = str(tmp_path / 'run')
  results = main.run(tiny_config(total_steps=40, eval_every=20, checkpoint_every=20,
                                 log_every=10), workdir)
  assert results['num_examples'] == 360  # Every test digit counted exactly once.
  evals = read_metrics(workdir, 'test')
  assert [row['step'] for row in evals] == [20, 40]
  assert {'accuracy', 'loss'} <= set(evals[-1])
  assert evals[-1]['accuracy'] > 0.2  # 40 steps of a tiny ViT: well above chance (0.1).
  train_rows = read_metrics(workdir, 'train')
  assert [row['step'] for row in train_rows] == [10, 20, 30, 40]
  assert train_rows[-1]['loss'] < train_rows[0]['loss']
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['20', '40']
  assert os.listdir(os.path.join(workdir, 'tensorboard'))
  assert json.load(open(os.path.join(workdir, 'config.json')))['model']['name'] == 'ViT-testing'

  # The same command with more steps continues from step 40.
  results = main.run(tiny_config(total_steps=50, log_every=10), workdir)
  assert [row['step'] for row in read_metrics(workdir, 'train')][-2:] == [40, 50]
  assert read_metrics(workdir, 'test')[-1]['step'] == 50

  # Rerunning the finished run trains nothing and returns its last evaluation.
  rerun = main.run(tiny_config(total_steps=50, log_every=10), workdir)
  assert rerun == pytest.approx(results)
  assert read_metrics(workdir, 'train')[-1]['step'] == 50
  assert [row['step'] for row in read_metrics(workdir, 'test')] == [20, 40, 50]

  # trainer=evaluate reproduces the last evaluation from the checkpoint.
  evaluated = main.run(tiny_config(trainer='evaluate', total_steps=50), workdir)
  assert evaluated['accuracy'] == pytest.approx(results['accuracy'])
  assert evaluated['num_examples'] == 360


def test_workdir_of_another_model_is_refused(tmp_path):
  workdir = str(tmp_path / 'run')
  main.run(tiny_config(total_steps=10), workdir)
  with pytest.raises(ValueError, match='written by a model of another shape'):
    main.run(tiny_config(**{'total_steps': 20, 'model.hidden_size': 48}), workdir)


def test_nan_loss_stops_and_names_the_step(tmp_path):
  workdir = str(tmp_path / 'run')
  config = tiny_config(**{'optimizer.learning_rate': 1e38, 'optimizer.grad_clip_norm': 0.0,
                          'optimizer.name': 'sgd', 'optimizer.warmup_steps': 0,
                          'checkpoint_every': 5, 'log_every': 5})
  with pytest.raises(divergence.TrainingDiverged, match=r'at step \d+; training stopped\. (The last '
                     r'checkpoint with finite weights is step \d+ in \S+|No checkpoint was '
                     r'written yet)\. Lower '
                     r'--config\.optimizer\.learning_rate \(now 1e\+38\), or clip gradients '
                     r'harder with --config\.optimizer\.grad_clip_norm \(now 0; 0 is off\)') as raised:
    main.run(config, workdir)
  assert isinstance(raised.value, errors.UserError)  # One line from the command line.


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
  curves = []
  for accum_steps in (1, 4):
    workdir = str(tmp_path / f'accum{accum_steps}')
    main.run(tiny_config(accum_steps=accum_steps, total_steps=10, log_every=1,
                         eval_every=0, checkpoint_every=0), workdir)
    curves.append([row['loss'] for row in read_metrics(workdir, 'train')])
  np.testing.assert_allclose(curves[1], curves[0], rtol=2e-4)


def _write_published_npz(path, image_size, num_classes):
  """A checkpoint in the published layout from a model at another size."""
  model = models.get_model('ViT-testing', num_classes=num_classes, patch_size=(4, 4))
  variables = model.init(jax.random.PRNGKey(1), np.zeros((1, image_size, image_size, 3)))
  params = jax.tree.map(lambda x: np.asarray(x) + 0.01, variables['params'])
  weights.save_npz(path, params)


def test_fine_tuning_from_a_published_npz(tmp_path):
  npz = str(tmp_path / 'ViT-testing.npz')
  _write_published_npz(npz, image_size=16, num_classes=5)  # 4x4 grid, 5 classes.
  workdir = str(tmp_path / 'finetune')
  config = tiny_config(pretrained=npz, total_steps=40, log_every=10, eval_every=0,
                       checkpoint_every=0)
  main.run(config, workdir)  # Digits: 2x2 grid, 10 classes.
  losses = [row['loss'] for row in read_metrics(workdir, 'train')]
  assert losses[-1] < losses[0]


def test_pretrained_weights_are_fitted_to_shapes_and_the_model_init_fills_in(tmp_path):
  """What the model gives (a pre_logits layer the file lacks, its new head) is its init's.

  The weights are fitted to the params' shapes on the host: the values equal those fitted to
  the initialised params, as they were before.
  """
  npz = str(tmp_path / 'ViT-testing.npz')
  _write_published_npz(npz, image_size=16, num_classes=5)  # No pre_logits.
  config = tiny_config(pretrained=npz, **{'model.representation_size': 16})
  task = classification.ClassificationTask(config, str(tmp_path / 'run'))
  tx, _ = optim.make_optimizer(config.optimizer, config.total_steps)
  target, _ = loop.abstract_state(task, tx, mesh_lib.make_mesh(config.mesh_shape), config)
  rng = jax.random.PRNGKey(3)
  fitted = task.initial_params(rng, target['params'])
  expected = weights.load_pretrained(npz, jax.device_get(jax.jit(task.init_params)(rng)))
  assert jax.tree.structure(fitted) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(fitted), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(got, want)
  assert np.abs(fitted['pre_logits']['kernel']).min() > 0  # Random: the init's, with `rng`.
  assert classification.ClassificationTask(tiny_config(), str(tmp_path / 'fresh')).initial_params(
      rng, target['params']) is None


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc')
def test_main_tunes_malloc_before_threads_start_and_starts_tensorflow_without_keras(tmp_path):
  # glibc's arena limit only holds if set before JAX's, TF's and orbax's threads
  # first allocate; set later, each thread keeps an arena of its own (as the
  # benchmark's untuned case in test_benchmark shows). Keras would add seconds to the start.
  # The garbage collector runs as runtime.collect_garbage_sparingly sets it.
  report = process_after(
      'vit_jax.main', '--config=configs/vit_digits.py', f'--workdir={tmp_path}',
      '--config.total_steps=2', '--config.model.num_layers=1', '--config.eval_every=0',
      '--config.checkpoint_every=0', cwd=REPO)
  assert report.arenas == 1
  assert not report.keras
  assert report.full_collection_threshold == runtime.PROGRAM_FULL_COLLECTION_THRESHOLD
  assert report.frozen > 100_000  # What the imports made, at least.


@pytest.mark.parametrize('platforms, on_cpu', [('cpu', True), ('cpu,cuda', True),
                                               ('cuda', False), ('tpu,cpu', False)])
def test_jax_runs_on_cpu_follows_jax_platforms(platforms, on_cpu):
  # Only read when a backend starts, which jax_runs_on_cpu never does.
  saved = jax.config.jax_platforms
  try:
    jax.config.update('jax_platforms', platforms)
    assert runtime.jax_runs_on_cpu() == on_cpu
  finally:
    jax.config.update('jax_platforms', saved)


def test_jax_runs_on_cpu_without_jax_platforms_matches_the_backend():
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  code = ('import jax; from vit_jax import runtime; '
          "print(runtime.jax_runs_on_cpu(), jax.default_backend() == 'cpu')")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
  assert out.returncode == 0, out.stderr
  predicted, actual = out.stdout.split()[-2:]
  assert predicted == actual


def test_the_first_log_line_leaves_the_compilation_out(tmp_path, monkeypatch, capsys):
  # A train step that takes 3 s to trace, as a large model takes to compile: its own line
  # says so, and the first log line's ex/s (and ETA) are the steps' alone.
  make_train_step = loop.make_train_step

  def slow_to_trace(*args, **kwargs):
    train_step = make_train_step(*args, **kwargs)

    def traced_slowly(state, batch, frozen):
      time.sleep(3)  # Runs while jax.jit traces, once.
      return train_step(state, batch, frozen)
    return traced_slowly

  monkeypatch.setattr(loop, 'make_train_step', slow_to_trace)
  workdir = str(tmp_path / 'run')
  main.run(tiny_config(total_steps=4, log_every=4, eval_every=0, checkpoint_every=0), workdir)
  compiled = re.search(r'^Compiled the train step in ([\d.]+)s\.$', capsys.readouterr().out,
                       re.M)
  assert float(compiled.group(1)) >= 3
  (first,) = read_metrics(workdir, 'train')
  assert 4 * 32 / first['examples_per_sec'] < 3  # The window's seconds, without the 3.


def test_bfloat16_compute_trains(tmp_path, monkeypatch):
  # model.dtype='bfloat16': the trainer's model multiplies in bfloat16, its parameters
  # (and so the checkpoint) stay float32, and the loss stays finite.
  tasks = []  # The task whose loss the trainer's train step runs.
  make_train_step = loop.make_train_step
  monkeypatch.setattr(loop, 'make_train_step',
                      lambda task, *args, **kwargs: tasks.append(task) or
                      make_train_step(task, *args, **kwargs))
  config = tiny_config(total_steps=10, log_every=5, **{'model.dtype': 'bfloat16'})
  workdir = str(tmp_path / 'run')
  results = main.run(config, workdir)
  assert np.isfinite(results['loss'])
  assert [row['step'] for row in read_metrics(workdir, 'train')] == [5, 10]
  assert all(np.isfinite(row['loss']) for row in read_metrics(workdir, 'train'))
  # The model built from this config, as the trainer builds it: bf16 compute, f32 params.
  model = config_lib.build_model(config.model, num_classes=10)
  assert (model.dtype, model.param_dtype) == (jnp.bfloat16, jnp.float32)
  params, step = checkpointing.restore_params(workdir)
  assert step == 10
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {np.dtype(np.float32)}
  pixels = np.zeros((2, 8, 8, 3), np.float32)
  _, state = jax.jit(lambda p, x: model.apply({'params': p}, x, capture_intermediates=True))(
      params, pixels)
  computed = {jax.tree_util.keystr(path): leaf.dtype for path, leaf in
              jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]}
  blocks = {path: dtype for path, dtype in computed.items()
            if "['encoderblock_" in path or "['Dense_" in path or "['head']" in path}
  assert len(blocks) >= 20 and set(blocks.values()) == {jnp.dtype(jnp.bfloat16)}, computed
  # The train step's loss (the trainer's own task) multiplies bfloat16 operands (attention
  # may accumulate its scores in float32).
  [task] = tasks
  batch = {'image': pixels, 'label': np.zeros(2, np.int32)}
  jaxpr = jax.make_jaxpr(task.loss)(params, batch, jax.random.PRNGKey(0), task.frozen_params())

  def dot_operand_dtypes(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'dot_general':
        found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          sub = getattr(sub, 'jaxpr', sub)  # ClosedJaxpr -> Jaxpr.
          if hasattr(sub, 'eqns'):
            found += dot_operand_dtypes(sub)
    return found

  dots = dot_operand_dtypes(jaxpr.jaxpr)
  assert len(dots) >= 10 and set(dots) == {('bfloat16', 'bfloat16')}, dots


def test_resumed_run_repeats_the_uninterrupted_one(tmp_path):
  config = tiny_config(total_steps=20, log_every=1, eval_every=0, checkpoint_every=10,
                       keep_checkpoints=5, **{'model.dropout_rate': 0.1})
  # As if killed between the checkpoints at steps 10 and 20.
  assert_resumed_run_repeats(config, tmp_path, last_step=20, resume_step=10)


def test_fine_tuning_from_a_workdir_at_another_resolution(tmp_path):
  source = str(tmp_path / 'source')
  main.run(tiny_config(total_steps=10), source)  # 8x8 digits: a 2x2 grid.
  workdir = str(tmp_path / 'finetune')
  main.run(tiny_config(pretrained=source, total_steps=20, log_every=10, eval_every=0,
                       checkpoint_every=0, **{'data.image_size': 16}), workdir)  # 4x4 grid.
  losses = [row['loss'] for row in read_metrics(workdir, 'train')]
  assert losses[-1] < losses[0]


def test_tfds_dataset_by_name(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  with tfds.testing.mock_data(num_examples=40):
    results = main.run(tiny_config(**{'data.dataset': 'cifar10', 'data.image_size': 8,
                                      'data.train_crop': 'inception_crop', 'data.flip': True,
                                      'total_steps': 4, 'log_every': 2, 'eval_every': 0,
                                      'checkpoint_every': 0, 'eval_batch_size': 16}),
                       str(tmp_path / 'cifar'))
  assert results['num_examples'] == 40


def test_no_recompiles_inside_the_training_loop(tmp_path, caplog):
  jax.config.update('jax_log_compiles', True)
  try:
    with caplog.at_level(logging.WARNING):
      main.run(tiny_config(total_steps=12, log_every=3, eval_every=4, checkpoint_every=6),
               str(tmp_path / 'run'))
  finally:
    jax.config.update('jax_log_compiles', False)
  compiled = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith('Finished XLA compilation of')]
  for name in ('train_step', 'eval_sums'):  # 12 steps and 3 evaluations: one compilation each.
    assert sum(f'jit({name})' in m for m in compiled) == 1, (name, compiled)


def test_the_loop_queues_at_most_steps_in_flight(tmp_path, monkeypatch):
  # Each step also multiplies 512x512 matrices for a tenth of a second or so, so a loop that
  # does not wait queues them all. When a step is queued, steps_in_flight - 1 at most are still
  # unfinished, by default (0, on CPUs 1) and as set (2); with no limit more are: the test sees
  # the queue it bounds.
  make_train_step = loop.make_train_step
  slow_steps = []

  def slow_train_step(*args, **kwargs):
    train_step = make_train_step(*args, **kwargs)

    def slowly(state, batch, frozen):
      state, metrics = train_step(state, batch, frozen)
      work = jax.lax.fori_loop(0, 40, lambda _, x: jnp.tanh(x @ x), jnp.full((512, 512), 0.01))
      return state, {**metrics, 'loss': metrics['loss'] + 0 * work[0, 0]}
    slow_steps.append(slowly)
    return slowly

  unfinished_at_queue = []  # Steps queued before each step and not finished then.
  outputs = []
  jit = jax.jit

  def counting_jit(fun, **kwargs):
    jitted = jit(fun, **kwargs)
    if fun not in slow_steps:
      return jitted

    def queue(*args):
      unfinished_at_queue.append(sum(not out.is_ready() for out in outputs))
      state, metrics = jitted(*args)
      outputs.append(metrics['loss'])
      return state, metrics
    return queue

  monkeypatch.setattr(loop, 'make_train_step', slow_train_step)
  monkeypatch.setattr(jax, 'jit', counting_jit)

  def most_queued(steps_in_flight):
    unfinished_at_queue.clear()
    outputs.clear()
    main.run(tiny_config(total_steps=8, log_every=8, eval_every=0, checkpoint_every=0,
                         steps_in_flight=steps_in_flight), str(tmp_path / str(steps_in_flight)))
    assert len(unfinished_at_queue) == 8
    return max(unfinished_at_queue)

  assert most_queued(0) == 0  # 0 on CPUs: each step waits for the one before.
  assert most_queued(2) == 1
  assert most_queued(100) > 1  # No limit: the loop runs ahead of the device.
