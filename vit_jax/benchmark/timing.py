"""Compiled steps, timed as training runs them; achieved FLOP/s and MFU.

Timing: after compilation (reported separately) and `--warmup` steps, each timed step's
time is the wall-clock time between its results being ready and the previous step's.
`pipelined` queues the next step before waiting for one, as the trainer's loop does (JAX
dispatches asynchronously), so the host's time to launch a step overlaps the device's
work on the one before; each round starts with one untimed step so that the first timed
step is queued too. `isolated` starts each step only when the one before is ready, so each
time includes the launch. `auto` (the default) pipelines on accelerators, where launching
a step's kernels takes the host milliseconds, and isolates steps on CPUs, where the host
and the step share the cores and launching costs next to nothing. Runners to compare
alternate in rounds so that background load hits them alike.

FLOPs: `vit_jax.flops.count_flops` counts multiply-adds of the jitted function
(the whole train step in train mode); achieved FLOP/s and MFU use 2 FLOPs per
multiply-add, as the peak figures do. MFU needs a peak: `--peak-tflops`, or the
table `PEAK_TFLOPS` by device kind; on CPUs it is left blank.
"""

import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np

from vit_jax import errors, files
from vit_jax.benchmark import memory
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


def progress(message: str):
  """One line on stderr as a long run goes (the table comes at the end, on stdout)."""
  print(f'benchmark: {message}', file=sys.stderr, flush=True)


SLOW_SECONDS = 20.0  # Work that takes longer says what it is, so that a stall shows where.


@contextlib.contextmanager
def said_if_slow(what: str, seconds: float = SLOW_SECONDS) -> Iterator[None]:
  """Prints `benchmark: WHAT (over N s so far)` if the work inside takes over `seconds`."""
  timer = threading.Timer(seconds, progress, [f'{what} (over {seconds:g} s so far)'])
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    timer.cancel()


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


TIMINGS = ('auto', 'pipelined', 'isolated')


def resolve_timing(how: str, platform: str) -> str:
  """`how` ('auto' becomes 'isolated' on CPUs, else 'pipelined')."""
  if how != 'auto':
    return how
  return 'isolated' if platform == 'cpu' else 'pipelined'


class Runner:
  """One step of an implementation per `start()`, which returns a function that waits for
  that step's results; calling the runner runs one step and waits."""

  def start(self) -> Callable[[], Any]:
    raise NotImplementedError

  def __call__(self):
    self.start()()


def time_alternating(runners: dict[str, Runner], steps: int, rounds: int,
                     how: str = 'pipelined') -> dict[str, Timing]:
  """Times `steps` steps of each runner, alternating the runners in `rounds` rounds.

  `how`: 'pipelined' or 'isolated' (see the module's docstring).
  """
  if how not in ('pipelined', 'isolated'):
    raise ValueError(f'how={how!r} is neither pipelined nor isolated')
  timings = {name: Timing() for name in runners}
  rounds = max(1, min(rounds, steps))
  progress(f'timing {steps} {how} steps each of {", ".join(runners)} in {rounds} rounds')
  per_round = [steps // rounds + (i < steps % rounds) for i in range(rounds)]
  for done, count in enumerate(per_round, 1):
    round_start = time.perf_counter()
    for name, runner in runners.items():
      times = timings[name].times
      if how == 'isolated':
        for _ in range(count):
          start = time.perf_counter()
          runner()
          times.append(time.perf_counter() - start)
        continue
      lead = runner.start()  # Untimed: the first timed step queues behind it.
      queued = runner.start()
      lead()
      ready = time.perf_counter()
      for i in range(count):
        following = runner.start() if i + 1 < count else None
        queued()
        now = time.perf_counter()
        times.append(now - ready)
        ready, queued = now, following
    progress(_round_line(done, rounds, time.perf_counter() - round_start, timings))
  return timings


def _round_line(done: int, rounds: int, seconds: float, timings: dict[str, Timing]) -> str:
  """'round 2/5 done in 8.1 s; median so far: ours 143.2 ms/step, timm 161.0 ms/step'."""
  medians = ', '.join(f'{name} {np.median(t.times) * 1e3:.1f} ms/step'
                      for name, t in timings.items())
  return f'round {done}/{rounds} done in {seconds:.1f} s; median so far: {medians}'


def peak_tflops(dtype: str, override: float | None) -> float | None:
  """Dense peak TFLOP/s of the first device for `dtype`, or None when unknown."""
  return override or device_kind_peak_tflops(jax.devices()[0].device_kind, dtype)


def device_kind_peak_tflops(device_kind: str, dtype: str) -> float | None:
  """Dense peak TFLOP/s of a device kind ('NVIDIA H200', ...) for `dtype`, from `PEAK_TFLOPS`."""
  kind = device_kind.lower()
  for pattern, bf16, fp32 in PEAK_TFLOPS:
    if pattern.lower() in kind:
      return bf16 if dtype == 'bfloat16' else fp32
  return None


def device_info() -> dict:
  """Where the steps run: platform, device kind and count; on CPUs the cores and load."""
  device = jax.devices()[0]
  info = {'platform': device.platform, 'device_kind': device.device_kind,
          'device_count': jax.device_count(), 'jax': jax.__version__}
  if device.platform == 'cpu':
    info['cpu_cores'] = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
        else os.cpu_count()
    if hasattr(os, 'getloadavg'):  # Other processes' load makes CPU timings noisy.
      info['load_average_1min'] = os.getloadavg()[0]
  return info


def compile_jitted(fn: Callable, *args, options: dict | None = None) -> tuple[Any, float]:
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


def throughput_figures(macs: int | None, step_s: float, peak: float | None) -> dict:
  """Multiply-adds per step, achieved TFLOP/s and MFU (None where unknown)."""
  if not macs:
    return {'macs_per_step': macs, 'achieved_tflops': None, 'mfu': None}
  achieved = 2.0 * macs / step_s / 1e12
  return {'macs_per_step': int(macs), 'achieved_tflops': achieved,
          'mfu': achieved / peak if peak else None}


class OursRunner(Runner):
  """A compiled step of our model and the state it threads through the steps."""

  def __init__(self, fn: Callable, args: tuple, *, donate_state: bool,
               xla_options: dict | None = None, name: str = 'our step'):
    self.fn = jax.jit(fn, donate_argnums=0 if donate_state else ())
    self.args = args
    self.donate_state = donate_state
    with said_if_slow(f'tracing and compiling the {name}'):
      self.macs = count_flops(fn, *args)
      self.compiled, self.compile_s = compile_jitted(self.fn, *args, options=xla_options)
    progress(f'{name} compiled in {self.compile_s:.1f} s')
    self.memory_analysis = memory.memory_analysis(self.compiled)
    self.output = None

  def write_hlo(self, path: str):
    """Writes the compiled step's optimised HLO text (`hlo_costs` reads it)."""
    files.write_text_atomically(path, self.compiled.as_text())

  def start(self) -> Callable[[], Any]:
    out = self.compiled(*self.args)  # Dispatched; JAX returns before the device is done.
    ready = out
    if self.donate_state:  # The new state replaces the donated one.
      self.args = (out[0],) + self.args[1:]
      # The next step may take the state before this one is waited for; the other outputs
      # come from the same execution and are ready with it.
      ready = out[1:]
    self.output = out
    return lambda: jax.block_until_ready(ready)
