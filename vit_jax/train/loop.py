"""The one training loop shared by every task (image classification, translation).

A task supplies the model-specific parts (see `Task`); the loop owns the mesh,
the jit-compiled sharded train step, gradient accumulation, checkpoints,
evaluation, logging and resuming.
"""

import math
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax import errors, progress, run_metrics
from vit_jax.models import partitioning
from vit_jax.train import checkpointing, config as config_lib, mesh as mesh_lib, run_config
from vit_jax.train import distributed, divergence, ema as ema_lib, eval_loop
from vit_jax.train import metrics as metrics_lib
from vit_jax.train import optim, out_of_memory, preemption

# {'step', 'params', 'opt_state', 'rng'}, and 'ema_params' (an average of 'params') with
# config.ema_decay > 0.
State = dict[str, Any]


class Task(Protocol):
  """The model-specific half of training."""

  def init_params(self, rng: jax.Array) -> Any:
    """Fresh parameters (traced under jit; must be a pure function of `rng`)."""

  def initial_params(self, rng: jax.Array, abstract_params: Any) -> Any:
    """Host (numpy) params to start from instead of `init_params(rng)`, or None.

    E.g. pretrained weights fitted to the shapes `abstract_params`; every process returns
    the same values, which the loop places into the params' shardings.
    """

  def frozen_params(self) -> Any:
    """Arrays the loss reads but never trains (e.g. a teacher's params), or None."""

  def loss(self, params: Any, batch: dict, rng: jax.Array,
           frozen: Any) -> tuple[jax.Array, dict]:
    """Mean training loss of a (micro)batch and scalar metrics to log."""

  def loss_weight(self, batch: dict) -> jax.Array:
    """What a (micro)batch's mean loss counts for in an accumulated step (e.g. its tokens)."""

  def eval_sums(self, params: Any, batch: dict) -> dict:
    """Per-batch sums of eval metrics over examples with `batch['mask'] == 1`."""

  def eval_summary(self, sums: dict) -> dict:
    """Turns summed eval metrics into the figures to report."""

  def extra_eval(self, params: Any, mesh, in_flight: int | None) -> dict:
    """Figures beyond per-batch sums (BLEU of decoded text, other datasets), or {}; at most
    `in_flight` batches queued on the devices at once (None: the run sets no limit)."""

  def train_batches(self, start_step: int) -> Iterator[dict]:
    """This process's training batches (numpy), forever, from batch `start_step` on."""

  def eval_batches(self) -> Iterable[dict]:
    """This process's test batches, one pass, padded with `mask` 0."""

  def num_eval_batches(self) -> int:
    """How many batches `eval_batches` yields (the same on every process)."""


def _init_state(task: Task, tx: optax.GradientTransformation, rng: jax.Array,
                with_ema: bool) -> State:
  params_rng, train_rng = jax.random.split(rng)
  params = task.init_params(params_rng)
  state = {'step': jnp.zeros((), jnp.int32), 'params': params,
           'opt_state': tx.init(params), 'rng': train_rng}
  return {**state, 'ema_params': params} if with_ema else state


def abstract_state(task: Task, tx: optax.GradientTransformation, mesh,
                   config: ml_collections.ConfigDict) -> tuple[State, State]:
  """Shapes of the train state, and its shardings on `mesh`."""
  with partitioning.boxed():  # Params and optimizer state carry their logical axis names.
    boxed = jax.eval_shape(lambda r: _init_state(task, tx, r, bool(config.ema_decay)),
                           jax.random.PRNGKey(config.seed))
  replicated = mesh_lib.replicated(mesh)
  shardings = {'step': replicated, 'rng': replicated}
  for key in ('params', 'ema_params', 'opt_state'):  # Params first: their errors name them.
    if key in boxed:
      shardings[key] = mesh_lib.tree_shardings(boxed[key], mesh, config.fsdp_min_size)
  shapes = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        nn.meta.unbox(boxed), shardings)
  return shapes, shardings


def _split_microbatches(batch: dict, accum_steps: int) -> dict:
  """(B, ...) -> (accum_steps, B / accum_steps, ...); microbatch i = examples i::accum."""
  def split(x):
    x = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def make_train_step(task: Task, tx: optax.GradientTransformation, schedule: Callable,
                    accum_steps: int, ema_decay: float = 0.0, ema_warmup: bool = True
                    ) -> Callable[[State, dict, Any], tuple[State, dict]]:
  """One optimizer update from one global batch, accumulating over microbatches.

  With `ema_decay`, the state's 'ema_params' follow the new params (`vit_jax.train.ema`).
  """

  def train_step(state: State, batch: dict, frozen: Any) -> tuple[State, dict]:
    grad_fn = jax.value_and_grad(lambda p, b, r: task.loss(p, b, r, frozen), has_aux=True)
    rng = jax.random.fold_in(state['rng'], state['step'])  # Per-step dropout keys.
    if accum_steps == 1:
      (loss, metrics), grads = grad_fn(state['params'], batch, rng)
    else:
      # Each microbatch's mean counts by its weight (examples, or target tokens), so the
      # accumulated step equals the step on the whole batch.
      def accumulate(carry, microbatch_and_index):
        microbatch, index = microbatch_and_index
        (loss, metrics), grads = grad_fn(state['params'], microbatch,
                                         jax.random.fold_in(rng, index))
        weight = task.loss_weight(microbatch)
        weighted = jax.tree.map(lambda x: x * weight, (loss, metrics, grads))
        return jax.tree.map(jnp.add, carry, (weighted, weight)), None
      microbatches = _split_microbatches(batch, accum_steps)
      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          grad_fn, state['params'], jax.tree.map(lambda x: x[0], microbatches), rng))
      (loss, metrics), grads = zeros
      (total, weight), _ = jax.lax.scan(accumulate, ((loss, metrics, grads), jnp.float32(0)),
                                        (microbatches, jnp.arange(accum_steps)))
      loss, metrics, grads = jax.tree.map(lambda x: x / jnp.maximum(weight, 1e-9), total)
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {**metrics, 'loss': loss, 'grad_norm': optax.global_norm(grads),
               'learning_rate': schedule(state['step'])}
    step = state['step'] + 1
    new_state = {'step': step, 'params': params, 'opt_state': opt_state, 'rng': state['rng']}
    if ema_decay:
      new_state['ema_params'] = ema_lib.update(state['ema_params'], params, step, ema_decay,
                                               ema_warmup)
    return new_state, metrics

  return train_step


def _prefetch(batches: Iterator[dict], mesh, size: int = 2) -> Iterator[dict]:
  """Assembles global device batches in a background thread, `size` ahead."""
  buffer: queue.Queue = queue.Queue(maxsize=size)
  sentinel = object()

  def producer():
    try:
      for batch in batches:
        buffer.put(mesh_lib.global_batch(batch, mesh))
      buffer.put(sentinel)
    except BaseException as error:  # Re-raised in the consumer.
      buffer.put(error)

  threading.Thread(target=producer, daemon=True).start()
  while True:
    item = buffer.get()
    if item is sentinel:
      return
    if isinstance(item, BaseException):
      raise item
    yield item


def _copy(tree, shardings):
  """New device buffers holding `tree`'s values (the EMA's start), in `shardings`."""
  return jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(tree)


def steps_in_flight(config: ml_collections.ConfigDict) -> int | None:
  """How many train steps (or eval batches) may be queued on the devices at once; None: any.

  `config.steps_in_flight`, where 0 is 1 on CPUs, whose XLA allocates a program's temporary
  buffers when it is queued, so that each queued one holds its own; accelerators reuse memory
  in stream order, and a full queue hides the host's time.
  """
  return config.steps_in_flight or (1 if jax.default_backend() == 'cpu' else None)


def _mean_metrics(pending: list[tuple[int, dict]]) -> dict:
  return {k: float(np.mean([m[k] for _, m in pending])) for k in pending[0][1]}


def train(config: ml_collections.ConfigDict, workdir: str, task: Task) -> dict:
  """Trains `task` for `config.total_steps`, resuming from WORKDIR's latest checkpoint.

  Returns the last evaluation's figures.
  """
  mesh = mesh_lib.make_mesh(config.mesh_shape)
  mesh_lib.check_batch_size(config.batch_size, mesh)
  mesh_lib.check_batch_size(config.eval_batch_size, mesh, 'eval_batch_size')
  shards = mesh_lib.num_batch_shards(mesh)
  if config.batch_size % (config.accum_steps * shards):
    raise errors.ConfigError(f'batch_size={config.batch_size} must split into accum_steps='
                             f'{config.accum_steps} microbatches divisible by the {shards} '
                             'batch shards of the mesh.')
  tx, schedule = optim.make_optimizer(config.optimizer, config.total_steps)
  rng = jax.random.PRNGKey(config.seed)
  target, shardings = abstract_state(task, tx, mesh, config)
  checkpointer = checkpointing.Checkpointer(workdir, keep=config.keep_checkpoints)

  start_step = checkpointer.latest_step()
  if start_step is not None:
    # The newest readable checkpoint; unreadable newer ones are set aside, said in one line.
    start_step, state = checkpointer.restore(target, move_aside=True)
    if start_step >= config.total_steps:
      checkpointer.close()
      return _finished(config, workdir, task, start_step, mesh, state)
    progress.log(f'Resumed from the checkpoint at step {start_step} in '
                 f'{checkpointer.directory}.')
    if config.ema_decay and 'ema_params' not in state:
      progress.log(f'The checkpoint at step {start_step} has no EMA weights '
                   f'(config.ema_decay was 0): the average starts from its weights.')
      state['ema_params'] = _copy(state['params'], shardings['params'])
  else:
    start_step = 0
    params_rng, train_rng = jax.random.split(rng)
    params = task.initial_params(params_rng, target['params'])
    if params is None:
      params = jax.jit(task.init_params, out_shardings=shardings['params'])(params_rng)
    else:
      params = mesh_lib.from_host(params, shardings['params'])
    opt_state = jax.jit(tx.init, out_shardings=shardings['opt_state'])(params)
    state = {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': opt_state,
             'rng': train_rng}
    if config.ema_decay:
      state['ema_params'] = _copy(params, shardings['params'])
    state = jax.device_put(state, shardings)
  # Written once the checkpoint (if any) was read into this config's model: a config that
  # cannot resume the run leaves the config that wrote it in place.
  run_config.save_config(workdir, config)
  metrics_lib.keep_rows_until(workdir, start_step)  # The steps from here are logged again.

  frozen = task.frozen_params()  # A teacher's params (host): FSDP-split like the model's.
  frozen_shardings = mesh_lib.tree_shardings(frozen, mesh, config.fsdp_min_size)
  frozen = mesh_lib.from_host(frozen, frozen_shardings)
  train_step = jax.jit(make_train_step(task, tx, schedule, config.accum_steps,
                                       config.ema_decay, config.ema_warmup),
                       in_shardings=(shardings, mesh_lib.batch_sharding(mesh),
                                     frozen_shardings),
                       out_shardings=(shardings, mesh_lib.replicated(mesh)),
                       donate_argnums=0)
  writer = metrics_lib.MetricWriter(workdir)
  timer = metrics_lib.Progress(start_step, config.total_steps, config.batch_size)
  eval_sums = jax.jit(task.eval_sums)  # Compiled once, reused by every evaluation.
  batches = _prefetch(task.train_batches(start_step), mesh)
  mesh_desc = ', '.join(f'{axis} {size}' for axis, size in mesh.shape.items())
  num_params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(target['params']))
  progress.log(f'Model {config_lib.describe_model(config.model)}: {num_params:,} parameters.')
  if config.optimizer.layer_decay != 1:
    progress.log(optim.describe_layer_decay(target['params'], config.optimizer.layer_decay))
  if config.optimizer.warmup_steps >= config.total_steps > start_step:
    progress.log(f'Note: config.optimizer.warmup_steps={config.optimizer.warmup_steps} >= '
                 f'config.total_steps={config.total_steps}: the learning rate never reaches '
                 f'its peak, {config.optimizer.learning_rate:g} (lower '
                 '--config.optimizer.warmup_steps for a short run).')
  progress.log(f'Training {config.total_steps} steps of batch {config.batch_size} on '
               f'{mesh.size} device(s) ({jax.devices()[0].platform}; mesh {mesh_desc}), '
               f'from step {start_step}; workdir {workdir}.')
  # Signals are held until the last save is complete: one after the last step is ignored.
  with preemption.StopRequests() as stop:
    try:
      last_eval = _train_steps(config, task, state, frozen, train_step, batches, start_step,
                               checkpointer, writer, timer, mesh, eval_sums, stop)
      progress.log(timer.summary())
    except jax.errors.JaxRuntimeError as error:
      if jax.process_count() == 1:
        raise  # main says an out-of-memory error in one line.
      if out_of_memory.is_out_of_memory(error):  # This process's own; the others lost it.
        distributed.exit_at_once(out_of_memory.message(config, error))
      last = checkpointer.latest_step()
      distributed.exit_lost_process(error, 'it resumes from the last checkpoint' + (
          f' (step {last}).' if last is not None else '; none was written yet.'))
    finally:
      checkpointer.close()
      writer.close()
  return last_eval


def _train_steps(config, task: Task, state: State, frozen, train_step, batches, start_step: int,
                 checkpointer: checkpointing.Checkpointer, writer, timer, mesh, eval_sums,
                 stop: preemption.StopRequests) -> dict:
  """Steps start_step + 1 .. total_steps, with logging, evaluation and checkpoints."""
  pending: list[tuple[int, dict]] = []
  in_flight = steps_in_flight(config)
  last_eval = {}
  for step in range(start_step + 1, config.total_steps + 1):
    wait_start = time.perf_counter()
    batch = next(batches)
    call_start = time.perf_counter()
    timer.add_data_wait(call_start - wait_start)
    if in_flight and len(pending) >= in_flight:  # The step in_flight back has finished.
      jax.block_until_ready(pending[-in_flight][1])
    state, step_metrics = train_step(state, batch, frozen)
    if step == start_step + 1:  # The call returns once traced, compiled and dispatched.
      compile_seconds = time.perf_counter() - call_start
      timer.exclude(compile_seconds)  # The first log line's ex/s and ETA are the steps'.
      progress.log(f'Compiled the train step in {compile_seconds:.1f}s.')
    pending.append((step, step_metrics))
    checkpointer.check()  # A save that failed in the background stops the run now.

    is_last = step == config.total_steps
    do_eval = is_last or (config.eval_every and step % config.eval_every == 0)
    do_save = is_last or (config.checkpoint_every and step % config.checkpoint_every == 0)
    if do_eval or do_save or step % config.log_every == 0:
      pending = jax.device_get(pending)
      divergence.check(pending, config.optimizer, checkpointer)
      train_metrics = _mean_metrics(pending)
      stats = timer.report(step)
      writer.write(step, 'train', {**train_metrics, **stats})
      progress.log(
          f'step {step}/{config.total_steps}  loss {train_metrics["loss"]:.4f}  '
          f'lr {train_metrics["learning_rate"]:.2e}  '
          f'{stats["examples_per_sec"]:.0f} ex/s  '
          f'data wait {100 * stats["data_wait_fraction"]:.0f}%  '
          f'{metrics_lib.memory_text(stats)}  ETA {progress.format_duration(stats["eta"])}')
      pending = []
    not_training_since = time.perf_counter()
    if do_save:
      checkpointer.save(step, state)
    if do_eval:
      # After the save is complete: the weights are kept whatever the evaluation meets.
      checkpointer.finish()
      last_eval = eval_loop.evaluate_state(task, state, mesh, eval_sums, in_flight)
      writer.write(step, 'test', last_eval)
      progress.log(f'eval at step {step}: {metrics_lib.figures(last_eval)}')
    timer.exclude(time.perf_counter() - not_training_since)
    if not is_last and stop.requested(step):
      if not do_save:
        checkpointer.save(step, state)
      checkpointer.finish()
      raise preemption.Stopped(
          f'Stopped by {stop.name()} at step {step} of {config.total_steps}: the checkpoint '
          f'of step {step} is in {checkpointer.directory}. Run the same command to resume.',
          stop.signum)
  return last_eval


def _finished(config, workdir: str, task: Task, step: int, mesh, state) -> dict:
  """A rerun of a finished run: says so, and returns its evaluation at `step`."""
  progress.log(f'{workdir} has finished: its latest checkpoint is at step {step} of '
               f'config.total_steps={config.total_steps}. Raise --config.total_steps to train '
               'further; --config.trainer=evaluate evaluates it again.')
  for row in reversed(run_metrics.read_rows(workdir)):
    if row.get('split') == 'test' and row.get('step') == step:
      results = {k: v for k, v in row.items() if k not in ('step', 'split')}
      progress.log(f'eval at step {step}: {metrics_lib.figures(results)}')
      return results
  results = _evaluate_checkpoint(config, task, state, step, mesh)  # The run stopped before it.
  writer = metrics_lib.MetricWriter(workdir)
  writer.write(step, 'test', results)
  writer.close()
  return results


def _evaluate_checkpoint(config, task: Task, state: dict, step: int, mesh) -> dict:
  """The test figures of the checkpoint of `step` (its `state`), said as `eval of step N: ...`."""
  results = eval_loop.evaluate_state(task, state, mesh, jax.jit(task.eval_sums),
                                     steps_in_flight(config))
  progress.log(f'eval of step {step}: {metrics_lib.figures(results)}')
  return results


def evaluate(config: ml_collections.ConfigDict, workdir: str, task: Task) -> dict:
  """Evaluates the latest checkpoint in WORKDIR on the test split (and its EMA weights).

  It only reads the workdir, as a run may be training there: the figures are printed and
  returned, not added to the run's metrics.jsonl or TensorBoard (they may be of another split
  or dataset than the run's own evaluations).
  """
  mesh = mesh_lib.make_mesh(config.mesh_shape)
  mesh_lib.check_batch_size(config.eval_batch_size, mesh, 'eval_batch_size')
  with checkpointing.Checkpointer(workdir, read_only=True) as checkpointer:
    if checkpointer.latest_step() is None:
      raise errors.MissingFileError(f'No checkpoint to evaluate in {checkpointer.directory}; '
                                    'train first, or point --workdir at a trained run.')
    tx, _ = optim.make_optimizer(config.optimizer, config.total_steps)
    target, _ = abstract_state(task, tx, mesh, config)
    state, step = {}, None
    for key in ('params', 'ema_params') if config.ema_decay else ('params',):
      state[key], step = checkpointer.restore_params(
          step, fall_back=config.checkpoint_fallback, abstract_params=target['params'],
          item=key)
  return _evaluate_checkpoint(config, task, state, step, mesh)
