"""`--mode infer` and `--mode train` of an image model, with timm alongside if asked."""

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.benchmark import memory, steps, timing, trace
from vit_jax.benchmark.timm_runner import TIMM_NAMES, TimmRunner, import_timm
from vit_jax.flops import count_flops
from vit_jax.models import cast
from vit_jax.models.attention import resolve_attention_impl


def init_vit_params(model, resolution: int, seed: int = 0) -> Any:
  """Random float32 params; the (zero-initialised) heads get small random kernels."""

  def init(rng):
    params = model.init(rng, jnp.zeros((1, resolution, resolution, 3)))['params']
    params = dict(params)
    for head in ('head', 'head_dist'):
      if head in params:
        kernel = params[head]['kernel']
        params[head] = {**params[head], 'kernel': 0.02 * jax.random.normal(
            jax.random.fold_in(rng, 1), kernel.shape, kernel.dtype)}
    return params

  return jax.jit(init)(jax.random.PRNGKey(seed))


def model_macs(args, images, labels) -> int:
  """Multiply-adds of one step of the model `args` describe (traced, not run)."""
  model = models.get_model(args.model, num_classes=steps.NUM_CLASSES,
                           **steps.model_overrides(args))
  image_spec = jax.ShapeDtypeStruct((1, args.resolution, args.resolution, 3), jnp.float32)
  params = jax.eval_shape(lambda r, x: model.init(r, x)['params'], jax.random.PRNGKey(0),
                          image_spec)
  step, tx = steps.vit_step(args, model)
  if tx is None:
    return count_flops(step, params, images)
  state = jax.eval_shape(lambda p: steps.make_train_state(p, tx), params)
  return count_flops(step, state, {'image': images, 'label': labels}, None)


def build_ours_vit(args, model, params, images, labels) -> timing.OursRunner:
  """Our compiled step: the forward pass, or the trainer's train step on (images, labels)."""
  step, tx = steps.vit_step(args, model)
  options = args.xla_options
  if tx is None:
    # The weights in the dtype the model casts them to, once, as a deployment keeps them.
    params = cast.cast_as_used(step, params, images)
    return timing.OursRunner(step, (params, images), donate_state=False, xla_options=options)
  batch = {'image': images, 'label': labels}
  return timing.OursRunner(step, (steps.make_train_state(params, tx), batch, None),
                           donate_state=True, xla_options=options)


def benchmark_vit(args) -> dict:
  """infer / train of an image model, with timm alongside if asked."""
  if args.compare == 'timm':
    import_timm(args.timm_path)  # Fails early, before anything is compiled.
  model = models.get_model(args.model, num_classes=steps.NUM_CLASSES,
                           **steps.model_overrides(args))
  with timing.said_if_slow(f'initialising the parameters of {args.model}'):
    params = init_vit_params(model, args.resolution)
  rng = np.random.default_rng(0)
  images_np = rng.standard_normal((args.batch, args.resolution, args.resolution, 3),
                                  np.float32)
  labels_np = rng.integers(0, steps.NUM_CLASSES, args.batch).astype(np.int32)
  images, labels = jax.device_put(images_np), jax.device_put(labels_np)

  # Compiled before anything runs (train mode donates `params` on its first step).
  ours = build_ours_vit(args, model, params, images, labels)
  if args.hlo_out:
    ours.write_hlo(args.hlo_out)
  check_logits = None
  timm_runner = None
  if args.compare == 'timm':
    with timing.said_if_slow(f'building timm {TIMM_NAMES[args.model]}'):
      timm_runner = TimmRunner(args, params, images_np, labels_np)
    timing.progress(f'timm {TIMM_NAMES[args.model]} built on {timm_runner.device}')
    reference = models.get_model(args.model, num_classes=steps.NUM_CLASSES,
                                 **{**steps.model_overrides(args), 'dtype': jnp.float32})
    check_logits = np.asarray(jax.jit(
        lambda p, x: reference.apply({'params': p}, x))(params, images))
  del params
  runners = {'ours': ours}
  warmup_s = {}
  start = time.perf_counter()
  for _ in range(args.warmup):
    ours()
  warmup_s['ours'] = time.perf_counter() - start
  memory_figures = {'ours': {'device_peak_bytes': memory.device_peak_bytes(),
                             'process_peak_rss_bytes': memory.peak_rss_bytes(),
                             'xla_memory_analysis': ours.memory_analysis}}
  extra = {}
  if timm_runner is not None:
    timm_logits = timm_runner.logits()
    extra['max_abs_logit_diff_vs_timm_f32'] = float(np.abs(timm_logits - check_logits).max())
    timm_runner.reset_peak_memory()
    start = time.perf_counter()
    for _ in range(max(args.warmup, 1)):
      timm_runner()
    warmup_s['timm'] = time.perf_counter() - start
    memory_figures['timm'] = {'device_peak_bytes': timm_runner.peak_memory(),
                              'process_peak_rss_bytes': memory.peak_rss_bytes()}
    runners['timm'] = timm_runner

  timings = timing.time_alternating(runners, args.steps, args.rounds, args.timing)
  peak = timing.peak_tflops(args.dtype, args.peak_tflops)
  # MFU counts the model's work, for both: not what remat or the chunked kernel recompute,
  # nor the token that cuDNN's even lengths add.
  model_work = ours.macs
  if args.remat or resolve_attention_impl(args.attention, dtype=steps.DTYPES[args.dtype]) in (
      'chunked', 'cudnn'):
    plain_args = argparse.Namespace(**{**vars(args), 'remat': False, 'attention': 'fused'})
    model_work = model_macs(plain_args, images, labels)
  macs = {'ours': model_work, 'timm': model_work}
  results = {}
  for name, times in timings.items():
    summary = times.summary(args.batch)
    summary['images_per_s'] = summary.pop('items_per_s')
    results[name] = {**summary, 'warmup_s': warmup_s[name], 'memory': memory_figures[name],
                     **timing.throughput_figures(macs[name], summary['step_s_median'], peak)}
  results['ours']['compile_s'] = ours.compile_s
  if timm_runner is not None:
    results['timm']['torch_threads'] = timm_runner.threads
    results['timm']['timm_model'] = TIMM_NAMES[args.model]
    results['ratio_images_per_s_ours_over_timm'] = (
        results['ours']['images_per_s'] / results['timm']['images_per_s'])
    # The fastest steps are the least disturbed by other processes on the machine.
    results['ratio_best_step_ours_over_timm'] = (
        results['timm']['step_s_min'] / results['ours']['step_s_min'])
  if args.trace:
    extra['trace'] = trace.record(ours, args.trace_steps, args.trace,
                                  hlo_text=ours.compiled.as_text())
  return {**extra, 'peak_tflops': peak, **results}
