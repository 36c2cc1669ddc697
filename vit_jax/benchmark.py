"""Speed, FLOP/s, MFU and memory of the models, optionally side by side with timm.

  python -m vit_jax.benchmark --model ViT-B_16 --mode infer --batch 8 --resolution 224 \\
      --dtype float32 [--steps 20] [--warmup 3] [--compare timm] [--json out.json] \\
      [--peak-tflops X] [--attention auto|fused|plain|chunked|blas] [--scan-layers] [--remat] \\
      [--no-tune-malloc] [--timm-path DIR] [--xla-option NAME=VALUE ...] [--matmul auto|xla|blas]
  python -m vit_jax.benchmark --model ViT-S_16 --mode train --batch 16 --compare timm
  python -m vit_jax.benchmark --model Transformer-base --mode seq2seq [--seq-len 64] \\
      [--decode-length 64] [--vocab-size 32000]
  python -m vit_jax.benchmark --attention-memory [--resolutions 256,512,768,1024]
  python -m vit_jax.benchmark --compile-depth

Modes:
  infer    jitted forward pass (eval mode) on random images.
  train    one real optimizer step: the trainer's `make_train_step` with AdamW from
           `optim.make_optimizer` (gradient clipping on), jitted with the state donated.
  seq2seq  Transformer training tokens/s (target tokens), and greedy decoding
           tokens/s with the key/value cache and without it (the whole decoder re-run
           for every new token); each decode includes encoding the source once.
  --attention-memory  ViT forward (batch 1) memory per attention path at growing
           token counts, from XLA's compiled memory analysis (deterministic: the
           buffers XLA allocates; nothing is run).
  --compile-depth  compile time of a deep model with `scan_layers` against a 4-layer
           model of the same width (and the deep model unrolled).

Timing: after compilation (reported separately) and `--warmup` steps, every step
is timed on its own, blocking until its results are ready. With `--compare timm`
the matching timm model, loaded with the same weights through
`vit_jax.convert.to_timm`, runs in the same process on the same inputs, and the two
alternate in rounds so that background load hits both alike.

FLOPs: `vit_jax.flops.count_flops` counts multiply-adds of the jitted function
(the whole train step in train mode); achieved FLOP/s and MFU use 2 FLOPs per
multiply-add, as the peak figures do. MFU needs a peak: `--peak-tflops`, or the
table `PEAK_TFLOPS` by device kind; on CPUs it is left blank.

Memory: on GPU/TPU the device's `peak_bytes_in_use` (and torch's
`max_memory_allocated`); on CPU the process's peak RSS (`resource.getrusage`),
which covers everything the process did so far, plus XLA's memory analysis of
the compiled function.

`--xla-option NAME=VALUE` (repeatable) compiles everything we measure with that XLA option, e.g.
`--xla-option xla_cpu_experimental_ynn_fusion_type=` runs XLA:CPU's dots on Eigen
instead of YNNPACK; comparing ours/timm across runs shows what an option is worth.

`--matmul` chooses who multiplies the float32 matrices of the Dense layers: 'xla'
(XLA:CPU's own kernels), 'blas' (MKL or OpenBLAS through `vit_jax.kernels.blas`) or
'auto' (the models' default: MKL on Intel CPUs where it is installed). The title
line shows what ran. FLOPs on the BLAS count like XLA's.

On CPUs, as in the trainer (`config.tune_malloc`), glibc is told to keep freed
memory, so that XLA's temporary buffer is not freshly mapped (and page-faulted) at
every step; see `vit_jax.runtime.tune_malloc`. It applies to the whole process, timm
included; `--no-tune-malloc` measures without it.
"""

import argparse
import dataclasses
import json
import os
import re
import resource
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax import errors, models
from vit_jax.kernels import blas
from vit_jax.models.attention import ATTENTION_IMPLEMENTATIONS, resolve_attention_impl
from vit_jax.train import loop, optim
from vit_jax import runtime
from vit_jax.flops import count_flops

# Dense peak TFLOP/s (bfloat16, float32) by device kind, first match wins. GPU float32
# figures are TF32 tensor-core peaks (XLA's default precision for float32 dots on
# Ampere and later); TPUs run float32 dots as bfloat16 passes by default.
PEAK_TFLOPS: tuple[tuple[str, float, float], ...] = (
    ('H100 PCIe', 756.0, 378.0),
    ('H100', 989.0, 494.0),
    ('H200', 989.0, 494.0),
    ('GH200', 989.0, 494.0),
    ('B200', 2250.0, 1100.0),
    ('A100', 312.0, 156.0),
    ('L40S', 362.0, 183.0),
    ('L4', 121.0, 60.0),
    ('TPU v6 lite', 918.0, 918.0),
    ('TPU v5 lite', 197.0, 197.0),
    ('TPU v5e', 197.0, 197.0),
    ('TPU v5p', 459.0, 459.0),
    ('TPU v5', 459.0, 459.0),
    ('TPU v4', 275.0, 275.0),
    ('TPU v3', 123.0, 123.0),
)

# Our registry name -> timm model name (created with pretrained=False).
TIMM_NAMES = {
    'ViT-Ti_16': 'vit_tiny_patch16_224', 'ViT-S_16': 'vit_small_patch16_224',
    'ViT-S_32': 'vit_small_patch32_224', 'ViT-B_16': 'vit_base_patch16_224',
    'ViT-B_32': 'vit_base_patch32_224', 'ViT-L_16': 'vit_large_patch16_224',
    'ViT-L_32': 'vit_large_patch32_224', 'ViT-H_14': 'vit_huge_patch14_224',
    'R50+ViT-B_16': 'vit_base_r50_s16_224', 'R26+ViT-S_32': 'vit_small_r26_s32_224',
    'R+ViT-Ti_16': 'vit_tiny_r_s16_p8_224', 'DeiT-Ti_16': 'deit_tiny_distilled_patch16_224',
    'DeiT-S_16': 'deit_small_distilled_patch16_224',
    'DeiT-B_16': 'deit_base_distilled_patch16_224',
}

NUM_CLASSES = 1000
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


# ----------------------------------------------------------------------------
# Measuring.


@dataclasses.dataclass
class Timing:
  """Per-step wall-clock times (seconds) of one implementation."""
  times: list[float] = dataclasses.field(default_factory=list)

  def summary(self, items_per_step: float) -> dict:
    t = np.asarray(self.times)
    median = float(np.median(t))
    return {'steps_timed': int(t.size), 'step_s_median': median,
            'step_s_p10': float(np.percentile(t, 10)),
            'step_s_p90': float(np.percentile(t, 90)),
            'step_s_iqr': float(np.percentile(t, 75) - np.percentile(t, 25)),
            'step_s_mean': float(t.mean()), 'step_s_min': float(t.min()),
            'items_per_s': items_per_step / median}


def time_alternating(runners: dict[str, Callable[[], Any]], steps: int,
                     rounds: int) -> dict[str, Timing]:
  """Times `steps` calls of each runner, alternating the runners in `rounds` rounds.

  Each runner performs one step and returns only when its results are ready.
  """
  timings = {name: Timing() for name in runners}
  rounds = max(1, min(rounds, steps))
  per_round = [steps // rounds + (i < steps % rounds) for i in range(rounds)]
  for count in per_round:
    for name, run in runners.items():
      for _ in range(count):
        start = time.perf_counter()
        run()
        timings[name].times.append(time.perf_counter() - start)
  return timings


def peak_rss_bytes() -> int:
  """This process's peak resident set size so far."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak if sys.platform == 'darwin' else peak * 1024  # Linux reports KiB.


def device_peak_bytes() -> int | None:
  """Peak bytes in use on the first device (GPU/TPU), or None where not reported."""
  stats = jax.devices()[0].memory_stats() if jax.devices() else None
  return int(stats['peak_bytes_in_use']) if stats and 'peak_bytes_in_use' in stats else None


def memory_analysis(compiled) -> dict | None:
  """XLA's buffer sizes of a compiled function (bytes), or None if unavailable."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except  # Not every backend implements it.
    return None
  if analysis is None:
    return None
  fields = ('temp_size_in_bytes', 'argument_size_in_bytes', 'output_size_in_bytes',
            'alias_size_in_bytes', 'generated_code_size_in_bytes')
  result = {f: int(getattr(analysis, f, 0) or 0) for f in fields}
  result['total_bytes'] = (result['temp_size_in_bytes'] + result['argument_size_in_bytes']
                           + result['output_size_in_bytes'] - result['alias_size_in_bytes'])
  return result


def peak_tflops(dtype: str, override: float | None) -> float | None:
  """Dense peak TFLOP/s of the first device for `dtype`, or None when unknown."""
  if override:
    return override
  kind = jax.devices()[0].device_kind.lower()
  for pattern, bf16, fp32 in PEAK_TFLOPS:
    if pattern.lower() in kind:
      return bf16 if dtype == 'bfloat16' else fp32
  return None


def device_info() -> dict:
  device = jax.devices()[0]
  info = {'platform': device.platform, 'device_kind': device.device_kind,
          'device_count': jax.device_count(), 'jax': jax.__version__}
  if device.platform == 'cpu':
    info['cpu_cores'] = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
        else os.cpu_count()
    if hasattr(os, 'getloadavg'):  # Other processes' load makes CPU timings noisy.
      info['load_average_1min'] = os.getloadavg()[0]
  return info


def _compile(fn: Callable, *args, options: dict | None = None) -> tuple[Any, float]:
  """Lowers and compiles `fn` (a jitted function) for `args` with XLA `options`.

  Returns the compiled function and the seconds it took.
  """
  start = time.perf_counter()
  lowered = fn.lower(*args)
  try:
    compiled = lowered.compile(compiler_options=options or None)
  except Exception as error:  # pylint: disable=broad-except  # XLA's own error types.
    if not options:
      raise
    raise errors.ConfigError(f'XLA did not compile with --xla-option {options}: {error}. Check '
                             'the option names against XLA_FLAGS=--help of this jaxlib.') from error
  return compiled, time.perf_counter() - start


def parse_xla_options(items: Sequence[str]) -> dict[str, bool | int | str]:
  """['name=value', ...] -> {name: value}; 'true'/'false' and integers are typed."""
  options = {}
  for item in items:
    name, sep, value = item.partition('=')
    if not sep or not name:
      raise errors.ConfigError(f'--xla-option {item!r} is not NAME=VALUE, e.g. '
                               'xla_cpu_experimental_ynn_fusion_type= (an empty value is allowed).')
    if value.lower() in ('true', 'false'):
      options[name] = value.lower() == 'true'
    elif re.fullmatch(r'-?\d+', value):
      options[name] = int(value)
    else:
      options[name] = value
  return options


def _throughput_figures(macs: int | None, step_s: float, peak: float | None) -> dict:
  if not macs:
    return {'macs_per_step': macs, 'achieved_tflops': None, 'mfu': None}
  achieved = 2.0 * macs / step_s / 1e12
  return {'macs_per_step': int(macs), 'achieved_tflops': achieved,
          'mfu': achieved / peak if peak else None}


# ----------------------------------------------------------------------------
# Our models.


def _model_overrides(args) -> dict:
  overrides = {'dtype': DTYPES[args.dtype], 'attention_impl': args.attention,
               'matmul': args.matmul}
  if args.num_layers:
    overrides['num_layers'] = args.num_layers
  if args.scan_layers:
    overrides['scan_layers'] = True
  if args.remat:
    overrides['remat'] = True
  return overrides


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


class _ImageTask:
  """The part of `loop.Task` that `make_train_step` uses, for random labelled images."""

  def __init__(self, model):
    self.model = model

  def loss(self, params, batch, rng, frozen):
    del frozen
    logits = self.model.apply({'params': params}, batch['images'], train=True,
                              rngs={'dropout': rng})
    heads = logits if isinstance(logits, tuple) else (logits,)  # DeiT: two heads.
    loss = sum(optax.softmax_cross_entropy_with_integer_labels(
        h.astype(jnp.float32), batch['labels']).mean() for h in heads) / len(heads)
    return loss, {}


class _Seq2SeqTask:
  """`make_train_step`'s view of a translation task: masked token cross-entropy."""

  def __init__(self, model):
    self.model = model

  def loss(self, params, batch, rng, frozen):
    del frozen
    logits = self.model.apply({'params': params}, batch['inputs'], batch['targets'],
                              train=True, rngs={'dropout': rng})
    weights = (batch['targets'] > 0).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0), {}


def _optimizer(total_steps: int):
  config = optim.default_config()
  config.name = 'adamw'
  config.weight_decay = 1e-4
  config.learning_rate = 1e-4
  return optim.make_optimizer(config, total_steps)


def make_train_state(params, tx) -> loop.State:
  return {'step': jnp.zeros((), jnp.int32), 'params': params,
          'opt_state': jax.jit(tx.init)(params), 'rng': jax.random.PRNGKey(1)}


class OursRunner:
  """A compiled step of our model and the state it threads through the steps."""

  def __init__(self, fn: Callable, args: tuple, *, donate_state: bool,
               xla_options: dict | None = None):
    self.fn = jax.jit(fn, donate_argnums=0 if donate_state else ())
    self.args = args
    self.donate_state = donate_state
    self.macs = count_flops(fn, *args)
    self.compiled, self.compile_s = _compile(self.fn, *args, options=xla_options)
    self.memory_analysis = memory_analysis(self.compiled)
    self.output = None

  def __call__(self):
    out = self.compiled(*self.args)
    if self.donate_state:  # The new state replaces the donated one.
      self.args = (out[0],) + self.args[1:]
    jax.block_until_ready(out)
    self.output = out


def _vit_step(args, model):
  """The function one benchmark step runs, and its optimizer (None in infer mode)."""
  if args.mode == 'infer':
    return (lambda p, x: model.apply({'params': p}, x)), None
  tx, schedule = _optimizer(total_steps=args.warmup + args.steps + 1)
  return loop.make_train_step(_ImageTask(model), tx, schedule, accum_steps=1), tx


def _model_macs(args, images, labels) -> int:
  """Multiply-adds of one step of the model `args` describe (traced, not run)."""
  model = models.get_model(args.model, num_classes=NUM_CLASSES, **_model_overrides(args))
  image_spec = jax.ShapeDtypeStruct((1, args.resolution, args.resolution, 3), jnp.float32)
  params = jax.eval_shape(lambda r, x: model.init(r, x)['params'], jax.random.PRNGKey(0),
                          image_spec)
  step, tx = _vit_step(args, model)
  if tx is None:
    return count_flops(step, params, images)
  state = jax.eval_shape(lambda p: make_train_state(p, tx), params)
  return count_flops(step, state, {'images': images, 'labels': labels}, None)


def build_ours_vit(args, model, params, images, labels) -> OursRunner:
  step, tx = _vit_step(args, model)
  options = args.xla_options
  if tx is None:
    return OursRunner(step, (params, images), donate_state=False, xla_options=options)
  batch = {'images': images, 'labels': labels}
  return OursRunner(step, (make_train_state(params, tx), batch, None), donate_state=True,
                    xla_options=options)


# ----------------------------------------------------------------------------
# timm (PyTorch), only with --compare timm.


def import_timm(extra_path: str | None):
  """(torch, timm), or raises ImportError with what to do."""
  if extra_path:
    sys.path.append(extra_path)
  try:
    import timm  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise errors.MissingPackageError(
        f'--compare timm needs torch and timm ({error}). Install them (pip install torch '
        'timm), or point --timm-path at a site-packages directory that has them.') from error
  return torch, timm


class TimmRunner:
  """The timm model with our weights, stepping like ours (eval forward or AdamW step)."""

  def __init__(self, args, params, images: np.ndarray, labels: np.ndarray):
    from vit_jax import convert  # pylint: disable=g-import-not-at-top
    torch, timm = import_timm(args.timm_path)
    self.torch = torch
    platform = jax.devices()[0].platform
    if platform == 'gpu' and torch.cuda.is_available():
      self.device = torch.device('cuda')
    elif platform == 'cpu':
      self.device = torch.device('cpu')
      torch.set_num_threads(device_info()['cpu_cores'])  # The cores XLA uses.
    else:
      raise errors.ConfigError(f'No torch device matches the JAX {platform} backend; '
                               '--compare timm runs on CPUs and CUDA GPUs.')
    if args.model not in TIMM_NAMES:
      raise errors.ConfigError(f'No timm counterpart of {args.model}; --compare timm knows '
                               f'{", ".join(TIMM_NAMES)}.')
    config = models.model_config(args.model)
    self.model = timm.create_model(
        TIMM_NAMES[args.model], pretrained=False, num_classes=NUM_CLASSES,
        img_size=args.resolution, drop_path_rate=config.get('droppath_rate', 0.0))
    state_dict = convert.to_timm(jax.device_get(params))
    missing, unexpected = self.model.load_state_dict(
        {k: torch.tensor(np.array(v)) for k, v in state_dict.items()}, strict=False)
    if missing or unexpected:
      raise errors.ConfigError(f'timm {TIMM_NAMES[args.model]} does not take our weights: missing '
                               f'{missing[:5]}, unexpected {unexpected[:5]}.')
    self.model.to(self.device)
    self.images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).to(
        self.device)
    self.labels = torch.from_numpy(labels.astype(np.int64)).to(self.device)
    self.autocast = args.dtype == 'bfloat16'
    self.mode = args.mode
    self.threads = torch.get_num_threads() if self.device.type == 'cpu' else None
    if self.mode == 'train':
      self.model.train()
      # As ours: AdamW(1e-4, 0.9, 0.999, 1e-8, wd 1e-4) after clipping to global norm 1
      # (torch decays every parameter, ours the kernels only).
      self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4,
                                         weight_decay=1e-4)
    else:
      self.model.eval()

  def logits(self) -> np.ndarray:
    """Eval-mode float32 logits on the benchmark images (for the same-weights check)."""
    torch = self.torch
    training = self.model.training
    self.model.eval()
    with torch.inference_mode():
      logits = self.model(self.images).float().cpu().numpy()
    self.model.train(training)
    return logits

  def _autocast(self):
    return self.torch.autocast(self.device.type, dtype=self.torch.bfloat16,
                               enabled=self.autocast)

  def __call__(self):
    torch = self.torch
    if self.mode == 'infer':
      with torch.inference_mode(), self._autocast():
        self.model(self.images)
    else:
      with self._autocast():
        logits = self.model(self.images)
      loss = torch.nn.functional.cross_entropy(logits.float(), self.labels)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.optimizer.step()
      self.optimizer.zero_grad(set_to_none=True)
    if self.device.type == 'cuda':
      torch.cuda.synchronize()

  def reset_peak_memory(self):
    if self.device.type == 'cuda':
      self.torch.cuda.reset_peak_memory_stats()

  def peak_memory(self) -> int | None:
    if self.device.type == 'cuda':
      return int(self.torch.cuda.max_memory_allocated())
    return None


# ----------------------------------------------------------------------------
# Benchmarks.


def benchmark_vit(args) -> dict:
  """infer / train of an image model, with timm alongside if asked."""
  if args.compare == 'timm':
    import_timm(args.timm_path)  # Fails early, before anything is compiled.
  model = models.get_model(args.model, num_classes=NUM_CLASSES, **_model_overrides(args))
  params = init_vit_params(model, args.resolution)
  rng = np.random.default_rng(0)
  images_np = rng.standard_normal((args.batch, args.resolution, args.resolution, 3),
                                  np.float32)
  labels_np = rng.integers(0, NUM_CLASSES, args.batch).astype(np.int32)
  images, labels = jax.device_put(images_np), jax.device_put(labels_np)

  # Compiled before anything runs (train mode donates `params` on its first step).
  ours = build_ours_vit(args, model, params, images, labels)
  check_logits = None
  timm_runner = None
  if args.compare == 'timm':
    timm_runner = TimmRunner(args, params, images_np, labels_np)
    reference = models.get_model(args.model, num_classes=NUM_CLASSES,
                                 **{**_model_overrides(args), 'dtype': jnp.float32})
    check_logits = np.asarray(jax.jit(
        lambda p, x: reference.apply({'params': p}, x))(params, images))
  del params
  runners = {'ours': ours}
  warmup_s = {}
  start = time.perf_counter()
  for _ in range(args.warmup):
    ours()
  warmup_s['ours'] = time.perf_counter() - start
  memory = {'ours': {'device_peak_bytes': device_peak_bytes(),
                     'process_peak_rss_bytes': peak_rss_bytes(),
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
    memory['timm'] = {'device_peak_bytes': timm_runner.peak_memory(),
                      'process_peak_rss_bytes': peak_rss_bytes()}
    runners['timm'] = timm_runner

  timings = time_alternating(runners, args.steps, args.rounds)
  peak = peak_tflops(args.dtype, args.peak_tflops)
  macs = {'ours': ours.macs}
  if timm_runner is not None:  # timm does the model's work: no recomputation.
    macs['timm'] = ours.macs
    if args.remat or args.attention == 'chunked':  # Both recompute in the backward pass.
      plain_args = argparse.Namespace(**{**vars(args), 'remat': False, 'attention': 'fused'})
      macs['timm'] = _model_macs(plain_args, images, labels)
  results = {}
  for name, timing in timings.items():
    summary = timing.summary(args.batch)
    summary['images_per_s'] = summary.pop('items_per_s')
    results[name] = {**summary, 'warmup_s': warmup_s[name], 'memory': memory[name],
                     **_throughput_figures(macs[name], summary['step_s_median'], peak)}
  results['ours']['compile_s'] = ours.compile_s
  if timm_runner is not None:
    results['timm']['torch_threads'] = timm_runner.threads
    results['timm']['timm_model'] = TIMM_NAMES[args.model]
    results['ratio_images_per_s_ours_over_timm'] = (
        results['ours']['images_per_s'] / results['timm']['images_per_s'])
    # The fastest steps are the least disturbed by other processes on the machine.
    results['ratio_best_step_ours_over_timm'] = (
        results['timm']['step_s_min'] / results['ours']['step_s_min'])
  return {**extra, 'peak_tflops': peak, **results}


def _greedy_decoders(model, batch: int, src_len: int, length: int):
  """Jittable greedy decoders (params, inputs) -> tokens (B, length), with/without cache.

  Generated tokens skip id 0 (padding, also the start token) so that every
  position stays a valid query in the uncached re-run.
  """
  decoder = model.clone(cached_decoding=True)
  inputs_shape = jax.ShapeDtypeStruct((batch, src_len), jnp.int32)
  targets_shape = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  cache_shapes = jax.eval_shape(decoder.init, jax.random.PRNGKey(0), inputs_shape,
                                targets_shape)['cache']

  def pick(logits):  # (B, V) -> (B,), never the padding id 0.
    return (jnp.argmax(logits[:, 1:], axis=-1) + 1).astype(jnp.int32)

  def cached(params, inputs):
    encoded = model.apply({'params': params}, inputs, method='encode')
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)

    def step(carry, _):
      cache, token = carry
      logits, updated = decoder.apply({'params': params, 'cache': cache}, encoded, inputs,
                                      token, method='decode', mutable=['cache'])
      token = pick(logits[:, -1])
      return (updated['cache'], token[:, None]), token

    # The first step adds the cross-attention keys/values to the cache; the scan follows.
    carry, first = step((cache, jnp.zeros((batch, 1), jnp.int32)), None)
    _, rest = jax.lax.scan(step, carry, None, length=length - 1)
    return jnp.concatenate([first[None], rest]).T

  def uncached(params, inputs):
    encoded = model.apply({'params': params}, inputs, method='encode')

    def step(targets, t):
      logits = model.apply({'params': params}, encoded, inputs, targets, method='decode')
      token = pick(jax.lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False))
      return jax.lax.dynamic_update_index_in_dim(targets, token, t, axis=1), token

    placeholder = jnp.ones((batch, length), jnp.int32)  # Not yet generated; never seen.
    _, tokens = jax.lax.scan(step, placeholder, jnp.arange(length))
    return tokens.T

  return cached, uncached


def benchmark_seq2seq(args) -> dict:
  """Transformer training tokens/s and cached vs uncached greedy decoding tokens/s."""
  if args.compare:
    print('note: --compare timm applies to image models; the seq2seq mode runs ours only.')
  overrides = _model_overrides(args)
  model = models.get_model(args.model, vocab_size=args.vocab_size, **overrides)
  rng = np.random.default_rng(0)
  shape = (args.batch, args.seq_len)
  inputs = jax.device_put(rng.integers(1, args.vocab_size, shape).astype(np.int32))
  targets = jax.device_put(rng.integers(1, args.vocab_size, shape).astype(np.int32))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), inputs, targets)['params']

  tx, schedule = _optimizer(total_steps=args.warmup + args.steps + 1)
  train_step = loop.make_train_step(_Seq2SeqTask(model), tx, schedule, accum_steps=1)
  batch = {'inputs': inputs, 'targets': targets}
  cached, uncached = _greedy_decoders(model, args.batch, args.seq_len, args.decode_length)
  options = args.xla_options
  runners = {
      'train': OursRunner(train_step, (make_train_state(
          jax.tree.map(jnp.copy, params), tx), batch, None), donate_state=True,
                          xla_options=options),
      'decode_cached': OursRunner(cached, (params, inputs), donate_state=False,
                                  xla_options=options),
      'decode_uncached': OursRunner(uncached, (params, inputs), donate_state=False,
                                    xla_options=options),
  }
  for runner in runners.values():
    for _ in range(args.warmup):
      runner()
  memory = {'device_peak_bytes': device_peak_bytes(),
            'process_peak_rss_bytes': peak_rss_bytes()}
  timings = time_alternating(runners, args.steps, args.rounds)
  peak = peak_tflops(args.dtype, args.peak_tflops)
  tokens = {'train': args.batch * args.seq_len,
            'decode_cached': args.batch * args.decode_length,
            'decode_uncached': args.batch * args.decode_length}
  results = {}
  for name, timing in timings.items():
    summary = timing.summary(tokens[name])
    summary['tokens_per_s'] = summary.pop('items_per_s')
    results[name] = {**summary, 'compile_s': runners[name].compile_s,
                     'xla_memory_analysis': runners[name].memory_analysis,
                     **_throughput_figures(runners[name].macs, summary['step_s_median'],
                                           peak if name == 'train' else None)}
  agree = np.mean(np.asarray(runners['decode_cached'].output)
                  == np.asarray(runners['decode_uncached'].output))
  return {**results, 'memory': memory, 'peak_tflops': peak,
          'train_source_plus_target_tokens_per_s': 2 * results['train']['tokens_per_s'],
          'cached_over_uncached_decode_speed': (results['decode_cached']['tokens_per_s']
                                                / results['decode_uncached']['tokens_per_s']),
          'greedy_tokens_agree_cached_vs_uncached': float(agree)}


def benchmark_attention_memory(args) -> dict:
  """Forward-pass memory per attention path and token count (XLA memory analysis)."""
  rows = []
  patch = models.model_config(args.model)['patch_size'][0]
  for resolution in args.resolutions:
    tokens = (resolution // patch) ** 2 + 1
    row = {'resolution': resolution, 'tokens': tokens}
    for impl in args.memory_impls:
      model = models.get_model(args.model, num_classes=NUM_CLASSES,
                               **{**_model_overrides(args), 'attention_impl': impl})
      images = jax.ShapeDtypeStruct((1, resolution, resolution, 3), jnp.float32)
      params = jax.eval_shape(lambda r, x, m=model: m.init(r, x)['params'],
                              jax.random.PRNGKey(0), images)
      apply = jax.jit(lambda p, x, m=model: m.apply({'params': p}, x))
      compiled, compile_s = _compile(apply, params, images, options=args.xla_options)
      row[impl] = {**memory_analysis(compiled), 'compile_s': compile_s}
    rows.append(row)
  return {'method': 'XLA compiled memory_analysis (temp + argument + output - alias)',
          'batch': 1, 'rows': rows}


def benchmark_compile_depth(args) -> dict:
  """Compile time of the deep model (scanned, and unrolled) vs a 4-layer model."""
  deep = models.model_config(args.depth_model)['num_layers']
  configs = [('shallow_scan', 4, True), ('deep_scan', deep, True)]
  if not args.no_unrolled:
    configs.append(('deep_unrolled', deep, False))

  def compile_once(num_layers, scan):
    model = models.get_model(args.depth_model, num_classes=NUM_CLASSES,
                             **{**_model_overrides(args), 'num_layers': num_layers,
                                'scan_layers': scan})
    images = jax.ShapeDtypeStruct((args.batch, args.resolution, args.resolution, 3),
                                  jnp.float32)
    params = jax.eval_shape(lambda r, x: model.init(r, x)['params'],
                            jax.random.PRNGKey(0), images)
    if args.mode == 'train':
      tx, schedule = _optimizer(total_steps=10)
      fn = loop.make_train_step(_ImageTask(model), tx, schedule, accum_steps=1)
      state = jax.eval_shape(lambda p: make_train_state(p, tx), params)
      fn_args = (state, {'images': images,
                         'labels': jax.ShapeDtypeStruct((args.batch,), jnp.int32)}, None)
    else:
      fn = lambda p, x: model.apply({'params': p}, x)  # noqa: E731
      fn_args = (params, images)
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*fn_args)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    lowered.compile(compiler_options=args.xla_options or None)
    return lower_s, time.perf_counter() - start

  compile_once(1, True)  # Warms up the compiler so that the first timed run is not special.
  results = {name: {'num_layers': layers, 'scan_layers': scan, 'runs': []}
             for name, layers, scan in configs}
  for _ in range(args.compile_repeats):  # Alternating, the best of the repeats.
    for name, layers, scan in configs:
      results[name]['runs'].append(compile_once(layers, scan))
  for entry in results.values():
    best = min(entry['runs'], key=sum)
    entry.update(lower_s=best[0], compile_s=best[1], total_s=sum(best))
  ratio = results['deep_scan']['total_s'] / results['shallow_scan']['total_s']
  summary = {'model': args.depth_model, 'mode': args.mode, **results,
             'deep_scan_over_shallow_scan': ratio}
  if 'deep_unrolled' in results:
    summary['deep_unrolled_over_shallow_scan'] = (results['deep_unrolled']['total_s']
                                                  / results['shallow_scan']['total_s'])
  return summary


# ----------------------------------------------------------------------------
# Printing.


def _ms(seconds: float | None) -> str:
  return '-' if seconds is None else f'{seconds * 1e3:.1f}'


def _mb(num_bytes: int | None) -> str:
  if num_bytes is None:
    return '-'
  mib = num_bytes / 2**20
  return f'{mib:,.1f}' if mib < 100 else f'{mib:,.0f}'


def _num(value: float | None, fmt: str) -> str:
  return '-' if value is None else format(value, fmt)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
  line = lambda r: '  '.join(  # noqa: E731
      str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
  return '\n'.join([line(header), line(['-' * w for w in widths])] + [line(r) for r in rows])


def format_vit(report: dict) -> str:
  names = [n for n in ('ours', 'timm') if n in report]
  get = lambda key, fn: [fn(report[n].get(key)) for n in names]  # noqa: E731
  rows = [
      ['compile (s)', _num(report['ours']['compile_s'], '.1f')] + ['-'] * (len(names) - 1),
      ['warm-up (s)'] + get('warmup_s', lambda v: _num(v, '.1f')),
      ['step median (ms)'] + get('step_s_median', _ms),
      ['step p10 / p90 (ms)'] + [f'{_ms(report[n]["step_s_p10"])} / '
                                 f'{_ms(report[n]["step_s_p90"])}' for n in names],
      ['step IQR (ms)'] + get('step_s_iqr', _ms),
      ['images/s'] + get('images_per_s', lambda v: _num(v, '.2f')),
      ['GMACs / step'] + get('macs_per_step', lambda v: _num(v and v / 1e9, '.4g')),
      ['achieved TFLOP/s'] + get('achieved_tflops', lambda v: _num(v, '.3f')),
      ['MFU'] + get('mfu', lambda v: '-' if v is None else f'{100 * v:.1f}%'),
  ]
  for n in names:
    memory = report[n]['memory']
    if memory.get('device_peak_bytes') is not None:
      label = 'peak device memory (MiB)'
      values = {k: _mb(report[k]['memory'].get('device_peak_bytes')) for k in names}
      break
  else:
    label = 'peak process RSS (MiB)'
    values = {k: _mb(report[k]['memory'].get('process_peak_rss_bytes')) for k in names}
  rows.append([label] + [values[n] for n in names])
  analysis = report['ours']['memory'].get('xla_memory_analysis')
  if analysis:
    rows.append(['XLA temp / total (MiB)', f'{_mb(analysis["temp_size_in_bytes"])} / '
                 f'{_mb(analysis["total_bytes"])}'] + ['-'] * (len(names) - 1))
  header = [''] + ['ours (jax)' if n == 'ours' else f'timm ({report[n]["timm_model"]})'
                   for n in names]
  lines = [_table(header, rows)]
  if 'timm' in report:
    lines.append(f'ours/timm images/s: {report["ratio_images_per_s_ours_over_timm"]:.3f} '
                 f'(median steps), {report["ratio_best_step_ours_over_timm"]:.3f} (fastest '
                 'steps)')
    lines.append(f'same weights: max |logit diff| {report["max_abs_logit_diff_vs_timm_f32"]:.1e}'
                 f' (float32); torch threads: {report["timm"]["torch_threads"]}')
  return '\n'.join(lines)


def format_seq2seq(report: dict) -> str:
  names = ['train', 'decode_cached', 'decode_uncached']
  rows = [[n, _num(report[n]['compile_s'], '.1f'), _ms(report[n]['step_s_median']),
           f'{_ms(report[n]["step_s_p10"])} / {_ms(report[n]["step_s_p90"])}',
           _num(report[n]['tokens_per_s'], ',.0f'),
           _num(report[n]['macs_per_step'] and report[n]['macs_per_step'] / 1e9, '.4g'),
           _num(report[n]['achieved_tflops'], '.3f')] for n in names]
  header = ['', 'compile (s)', 'step median (ms)', 'p10 / p90 (ms)', 'tokens/s',
            'GMACs/step', 'TFLOP/s']
  mfu = report['train']['mfu']
  return '\n'.join([
      _table(header, rows),
      'train tokens are target tokens (source + target: '
      f'{report["train_source_plus_target_tokens_per_s"]:,.0f}/s); '
      f'train MFU: {"-" if mfu is None else f"{100 * mfu:.1f}%"}',
      f'cached / uncached decoding speed: {report["cached_over_uncached_decode_speed"]:.2f}x'
      f'   (greedy tokens equal: {100 * report["greedy_tokens_agree_cached_vs_uncached"]:.0f}%)',
  ])


def format_attention_memory(report: dict, impls: Sequence[str]) -> str:
  header = ['resolution', 'tokens'] + [f'{i} temp MiB' for i in impls] + [
      f'{i} total MiB' for i in impls]
  rows = [[str(r['resolution']), str(r['tokens'])]
          + [_mb(r[i]['temp_size_in_bytes']) for i in impls]
          + [_mb(r[i]['total_bytes']) for i in impls] for r in report['rows']]
  return '\n'.join([_table(header, rows),
                    f'batch 1; {report["method"]}; temp = activations and scratch.'])


def format_compile_depth(report: dict) -> str:
  names = [n for n in ('shallow_scan', 'deep_scan', 'deep_unrolled') if n in report]
  rows = [[n, str(report[n]['num_layers']), str(report[n]['scan_layers']),
           f'{report[n]["lower_s"]:.1f}', f'{report[n]["compile_s"]:.1f}',
           f'{report[n]["total_s"]:.1f}'] for n in names]
  lines = [_table(['', 'layers', 'scan', 'trace+lower (s)', 'XLA compile (s)', 'total (s)'],
                  rows),
           f'{report["model"]} ({report["mode"]}): deep/shallow compile time with scan: '
           f'{report["deep_scan_over_shallow_scan"]:.2f}x (target < 2x)']
  if 'deep_unrolled_over_shallow_scan' in report:
    lines.append(f'unrolled deep / shallow scan: {report["deep_unrolled_over_shallow_scan"]:.2f}x')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------
# Command line.


def _attention_name(args) -> str:
  """The --attention choice, with the kernel it resolves to when that differs."""
  kernel = resolve_attention_impl(args.attention, dtype=DTYPES[args.dtype], matmul=args.matmul)
  return args.attention if kernel == args.attention else f'{args.attention} ({kernel})'


def _matmul_name(args) -> str:
  """The --matmul choice, with what it resolves to (and the BLAS library) here."""
  resolved = blas.resolve_matmul(args.matmul, dtype=DTYPES[args.dtype])
  if resolved == 'blas':
    resolved = f'blas: {blas.load().name}'
  return args.matmul if resolved == args.matmul else f'{args.matmul} ({resolved})'


def _int_list(text: str) -> list[int]:
  return [int(x) for x in text.split(',') if x]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.benchmark',
      description='Throughput, FLOP/s, MFU and memory of vit_jax models (optionally '
                  'against timm), attention memory, and compile time against depth.',
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--model', default='ViT-B_16', help='registry name')
  parser.add_argument('--mode', default='infer', choices=('infer', 'train', 'seq2seq'))
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--resolution', type=int, default=224, help='image side (pixels)')
  parser.add_argument('--dtype', default='float32', choices=tuple(DTYPES),
                      help='compute dtype (params stay float32; timm runs under autocast)')
  parser.add_argument('--steps', type=int, default=20, help='timed steps per implementation')
  parser.add_argument('--warmup', type=int, default=3, help='untimed steps after compiling')
  parser.add_argument('--rounds', type=int, default=5,
                      help='alternation rounds the timed steps are split into')
  parser.add_argument('--compare', choices=('timm',), help='also time the timm model')
  parser.add_argument('--timm-path', help='extra directory appended to sys.path to find '
                      'torch and timm')
  parser.add_argument('--json', help='write all figures to this file')
  parser.add_argument('--tune-malloc', action=argparse.BooleanOptionalAction, default=None,
                      help='glibc: reuse freed memory instead of mmap-ing (and page-faulting) '
                      "XLA's per-step temporary buffer anew; applies to the whole process, "
                      "timm included (default: on CPUs, as the trainer's config.tune_malloc)")
  parser.add_argument('--xla-option', action='append', default=[], metavar='NAME=VALUE',
                      help='XLA compiler option for everything we compile (repeatable)')
  parser.add_argument('--peak-tflops', type=float,
                      help='dense peak TFLOP/s of one device for MFU (default: known devices)')
  parser.add_argument('--attention', default='auto', choices=ATTENTION_IMPLEMENTATIONS,
                      help="attention kernel; 'auto' picks the backend's fastest")
  parser.add_argument('--matmul', default='auto', choices=blas.MATMUL_IMPLEMENTATIONS,
                      help="float32 Dense products: XLA's kernels, a BLAS (MKL/OpenBLAS), "
                      "or 'auto' (MKL on Intel CPUs)")
  parser.add_argument('--num-layers', type=int, help='override the model\'s depth')
  parser.add_argument('--scan-layers', action='store_true')
  parser.add_argument('--remat', action='store_true')
  parser.add_argument('--seq-len', type=int, default=64, help='seq2seq source/target length')
  parser.add_argument('--decode-length', type=int, default=64,
                      help='seq2seq: tokens generated per greedy decode')
  parser.add_argument('--vocab-size', type=int, default=32000)
  parser.add_argument('--attention-memory', action='store_true',
                      help='memory of the attention paths at growing token counts')
  parser.add_argument('--resolutions', type=_int_list, default=[256, 512, 768, 1024],
                      help='--attention-memory: comma-separated image sides')
  parser.add_argument('--memory-impls', type=lambda s: s.split(','),
                      default=['plain', 'fused', 'chunked'],
                      help='--attention-memory: attention paths to compare')
  parser.add_argument('--compile-depth', action='store_true',
                      help='compile time of --depth-model (scanned) vs 4 layers')
  parser.add_argument('--depth-model', default='ViT-H_14')
  parser.add_argument('--compile-repeats', type=int, default=2)
  parser.add_argument('--no-unrolled', action='store_true',
                      help='--compile-depth: skip compiling the deep model unrolled')
  args = parser.parse_args(argv)
  if args.steps < 1 or args.batch < 1 or args.warmup < 0:
    parser.error('--steps and --batch must be positive and --warmup non-negative')
  unknown = [i for i in args.memory_impls if i not in ATTENTION_IMPLEMENTATIONS]
  if unknown:
    parser.error(f'--memory-impls: unknown {unknown}; choose from {ATTENTION_IMPLEMENTATIONS}')
  try:
    args.xla_options = parse_xla_options(args.xla_option)  # Typed, for the compiler.
  except ValueError as error:
    parser.error(str(error))
  return args


def run(args: argparse.Namespace) -> tuple[dict, str]:
  """Runs the benchmark `args` select; returns (all figures, the printed table)."""
  if args.attention_memory:
    report = benchmark_attention_memory(args)
    text = format_attention_memory(report, args.memory_impls)
    title = f'{args.model} forward memory by attention path ({args.dtype})'
  elif args.compile_depth:
    report = benchmark_compile_depth(args)
    text = format_compile_depth(report)
    title = f'compile time against depth ({args.depth_model}, batch {args.batch}, ' \
            f'{args.resolution}px, {args.dtype})'
  elif args.mode == 'seq2seq':
    report = benchmark_seq2seq(args)
    text = format_seq2seq(report)
    title = (f'{args.model} seq2seq | batch {args.batch} | source/target {args.seq_len} | '
             f'decode {args.decode_length} | vocab {args.vocab_size} | {args.dtype}')
  else:
    report = benchmark_vit(args)
    text = format_vit(report)
    title = (f'{args.model} {args.mode} | batch {args.batch} | {args.resolution}px | '
             f'{args.dtype} | attention {_attention_name(args)} | matmul {_matmul_name(args)}'
             + (' | scan' if args.scan_layers else '') + (' | remat' if args.remat else '')
             + (' | tuned malloc' if args.tune_malloc else ''))
  if args.xla_option:
    title += ' | XLA ' + ' '.join(args.xla_option)
  info = device_info()
  if 'cpu_cores' in info:
    where = f'cpu ({info["cpu_cores"]} cores'
    load = info.get('load_average_1min')
    where += ')' if load is None else f', load average {load:.1f} at the end)'
  else:
    where = f'{info["platform"]} ({info["device_kind"]}, {info["device_count"]} device(s))'
  text = f'{title} | {where}\n{text}'
  report = {'args': {k: v for k, v in vars(args).items()}, 'device': info, **report}
  return report, text


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.compare:  # Leave GPU memory to torch: JAX would take 75% of it at start-up.
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  if args.tune_malloc is None:  # Decided before JAX starts its threads (see tune_malloc).
    args.tune_malloc = runtime.jax_runs_on_cpu()
  if args.tune_malloc and not runtime.tune_malloc():
    print('note: --tune-malloc needs glibc (Linux); running without it.', file=sys.stderr)
    args.tune_malloc = False
  try:
    report, text = run(args)
  except errors.UserError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  print(text)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(report, f, indent=2, default=str)
    print(f'Wrote {args.json}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
