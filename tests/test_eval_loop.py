"""The evaluation pass: its sums, and how many batches it queues on the devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import errors, evaluation, main
from vit_jax.train import eval_loop, loop, mesh as mesh_lib
from helpers import digits_config, override, slowly

NUM_BATCHES = 6


class SlowTask:
  """Batches of 4 numbers; each batch's sums also multiply 512x512 matrices for a tenth of a
  second or so, so that a pass that does not wait queues them all."""

  def __init__(self, num_batches=NUM_BATCHES):
    self.batches = [{'x': np.arange(4, dtype=np.float32) + 4 * i} for i in range(num_batches)]
    self.outputs = []  # The sums of each batch queued so far.
    self.unfinished_at_queue = []  # How many of them had not finished when a batch was queued.

  def num_eval_batches(self):
    return len(self.batches)

  def eval_batches(self):
    return iter(self.batches)

  def eval_sums(self, params, batch):
    self.unfinished_at_queue.append(sum(not out['total'].is_ready() for out in self.outputs))
    sums = slowly({'total': params * jnp.sum(batch['x'])})
    self.outputs.append(sums)
    return sums

  def eval_summary(self, sums):
    return {'total': float(sums['total'])}

  def extra_eval(self, params, mesh, in_flight):
    del params, mesh, in_flight
    return {}


@pytest.mark.parametrize('in_flight, most_unfinished', [(1, 0), (2, 1)])
def test_a_pass_queues_at_most_in_flight_batches(in_flight, most_unfinished):
  task = SlowTask()
  results = eval_loop.evaluate_params(task, jnp.float32(2), mesh_lib.make_mesh(),
                                      task.eval_sums, in_flight)
  assert results == {'total': 2 * sum(range(4 * NUM_BATCHES))}
  assert len(task.unfinished_at_queue) == NUM_BATCHES
  assert max(task.unfinished_at_queue) == most_unfinished


def test_with_no_limit_the_pass_runs_ahead_of_the_device():
  # What the limit bounds: unlimited, the host queues batches while earlier ones still run.
  task = SlowTask()
  eval_loop.evaluate_params(task, jnp.float32(2), mesh_lib.make_mesh(), task.eval_sums, None)
  assert max(task.unfinished_at_queue) > 1


def test_the_trainers_evaluations_queue_as_its_steps(tmp_path, monkeypatch):
  # config.steps_in_flight bounds the evaluations of a training run and of
  # trainer=evaluate as it bounds the steps; 0 is one at a time on CPUs.
  limits = []
  evaluate_params = eval_loop.evaluate_params

  def spy(task, params, mesh, eval_sums, in_flight=None):
    limits.append(in_flight)
    return evaluate_params(task, params, mesh, eval_sums, in_flight)

  extra_limits = []  # And those of config.evals.
  run_evaluations = evaluation.run

  def spy_extra(*args, in_flight=None, **kwargs):
    extra_limits.append(in_flight)
    return run_evaluations(*args, in_flight=in_flight, **kwargs)

  monkeypatch.setattr(eval_loop, 'evaluate_params', spy)
  monkeypatch.setattr(evaluation, 'run', spy_extra)
  config = digits_config(total_steps=2, log_every=2, evals=('fewshot',), **{'fewshot.shots': (1,)})
  main.run(config, str(tmp_path))
  main.run(override(config, {'trainer': 'evaluate', 'steps_in_flight': 3}), str(tmp_path))
  assert limits == extra_limits == [loop.steps_in_flight(digits_config()), 3]
  assert jax.default_backend() != 'cpu' or limits[0] == 1


def test_an_empty_split_is_one_line():
  task = SlowTask(num_batches=0)
  with pytest.raises(errors.ConfigError, match='The test split is empty'):
    eval_loop.evaluate_params(task, jnp.float32(2), mesh_lib.make_mesh(), task.eval_sums, 1)
