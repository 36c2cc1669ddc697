"""`--trace DIR`: steps recorded by the JAX profiler, and where their time goes.

`record` runs a step `--trace-steps` times under `jax.profiler.trace(DIR,
create_perfetto_trace=True)` and summarises the `perfetto_trace.json.gz` it writes.
`summarise` reads the op events of that trace: the kernels on the GPU's stream tracks
when there are any, else (CPUs) the XLA ops the host threads ran (events naming an
`hlo_op`). Each op counts its self time (less the ops nested in it, e.g. a while
loop's body), so the op times add up. The summary: op time per step, time by category
(by op or kernel name, first match of `CATEGORIES` wins) and the ops taking the most.
Given the step's optimised HLO, a host op that calls a library (`ffi_call.7`: our products
and attention on the BLAS) is named with its target (`ffi_call.7 (vit_jax_gemm_bf16)`) and
counted in that target's category.
"""

import collections
import glob
import gzip
import json
import os
import re
from typing import Any, Callable

import jax

from vit_jax import errors, files
from vit_jax.benchmark import hlo_costs

CATEGORIES: tuple[tuple[str, re.Pattern], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        # cuDNN's convolution kernels (the patch embedding) name cuDNN too.
        ('matmul', r'implicit_gemm|convolve'),
        ('attention', r'fmha|flash|sdpa|dot_product_attention|cudnn(?![-_]?conv)'
                      r'|vit_jax_attention'),
        ('matmul', r'gemm|vit_jax_dense|cublas|cutlass|nvjet|dot|convolution|conv(?!ert)'),
        ('normalization', r'vit_jax_group_norm'),
        ('collective', r'all[-_]reduce|all[-_]gather|reduce[-_]scatter|all[-_]to[-_]all|nccl'
                       r'|collective'),
        ('copy/transpose', r'copy|transpose|memcpy|dynamic[-_]update[-_]slice'),
        # XLA:CPU runs a lone elementwise op as `wrapped_<op>` (a cast: `wrapped_convert`).
        ('fusion (elementwise/reduce)', r'fusion|loop_|input_|reduce|elementwise|wrapped_'),
    )) + (('other', re.compile('')),)
DEVICE_SOURCE = 'device kernels'
HOST_SOURCE = 'host XLA ops'


def category(name: str) -> str:
  """The first category whose pattern `name` (an op or kernel name) matches."""
  return next(label for label, pattern in CATEGORIES if pattern.search(name))


def _track_names(events: list[dict]) -> tuple[dict, dict]:
  """({pid: process name}, {(pid, tid): thread name}) from the metadata events."""
  processes, threads = {}, {}
  for event in events:
    if event.get('ph') != 'M':
      continue
    if event.get('name') == 'process_name':
      processes[event['pid']] = event['args']['name']
    elif event.get('name') == 'thread_name':
      threads[(event['pid'], event['tid'])] = event['args']['name']
  return processes, threads


def op_events(trace: dict) -> tuple[str, list[dict]]:
  """(source, events): the GPU's kernel events if there are any, else the host's XLA ops."""
  events = trace['traceEvents']
  processes, threads = _track_names(events)
  spans = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
  device = [e for e in spans
            if processes.get(e['pid'], '').startswith('/device:')
            and 'CPU' not in processes[e['pid']]
            and threads.get((e['pid'], e.get('tid')), '').lower().startswith('stream')]
  if device:
    return DEVICE_SOURCE, device
  return HOST_SOURCE, [e for e in spans if 'hlo_op' in e.get('args', {})]


def self_times(events: list[dict]) -> list[float]:
  """Each event's duration less those of the events nested in it on its thread (us)."""
  order = sorted(range(len(events)), key=lambda i: (events[i]['pid'], events[i].get('tid'),
                                                    events[i]['ts'], -events[i]['dur']))
  times = [float(e['dur']) for e in events]
  stack = []  # Indices of the enclosing events on the current thread.
  for i in order:
    event = events[i]
    track = (event['pid'], event.get('tid'))
    while stack and ((events[stack[-1]]['pid'], events[stack[-1]].get('tid')) != track
                     or events[stack[-1]]['ts'] + events[stack[-1]]['dur'] <= event['ts']):
      stack.pop()
    if stack:
      times[stack[-1]] -= event['dur']
    stack.append(i)
  return times


def summarise(trace: dict, steps: int, top: int = 15, hlo_text: str | None = None) -> dict:
  """Op time per step, by category and for the `top` ops, of a trace of `steps` steps;
  `hlo_text` (the step's optimised HLO) names the custom calls' targets."""
  source, events = op_events(trace)
  if not events:
    raise errors.UserError('The profiler trace holds no kernel or XLA op events to summarise.')
  targets = hlo_costs.custom_call_targets(hlo_text) if hlo_text else {}
  by_op, counts = collections.Counter(), collections.Counter()
  for event, us in zip(events, self_times(events)):
    name = event['name']
    if name in targets:
      name = f'{name} ({targets[name]})'
    by_op[name] += us
    counts[name] += 1
  total_us = sum(by_op.values())
  by_category = collections.Counter()
  for name, us in by_op.items():
    by_category[category(name)] += us
  entry = lambda us: {'ms_per_step': us / 1e3 / steps, 'share': us / total_us}  # noqa: E731
  return {
      'source': source, 'steps': steps, 'events': len(events),
      'op_ms_per_step': total_us / 1e3 / steps,
      'categories': [{'name': name, **entry(us)} for name, us in by_category.most_common()],
      'top_ops': [{'name': name, 'category': category(name), 'calls_per_step': counts[name] / steps,
                   **entry(us)} for name, us in by_op.most_common(top)],
  }


def load(directory: str, not_before: set[str] = frozenset()) -> tuple[str, dict]:
  """(path, trace) of the newest perfetto_trace.json.gz under `directory` not in `not_before`."""
  paths = set(glob.glob(os.path.join(directory, '**', 'perfetto_trace.json.gz'),
                        recursive=True)) - set(not_before)
  if not paths:
    raise errors.MissingFileError(f'The profiler wrote no perfetto_trace.json.gz under '
                                  f'{directory}.')
  path = max(paths, key=os.path.getmtime)
  with gzip.open(path, 'rt') as f:
    return path, json.load(f)


def record(step: Callable[[], Any], steps: int, directory: str,
           hlo_text: str | None = None) -> dict:
  """Runs `step` (which blocks until its results are ready) `steps` times under the
  profiler, writing the trace under `directory`; returns its `summarise` (with the step's
  optimised HLO, `hlo_text`), with its path."""
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as error:
    raise files.cannot_write(directory, error) from None
  earlier = set(glob.glob(os.path.join(directory, '**', 'perfetto_trace.json.gz'),
                          recursive=True))
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    for _ in range(steps):
      step()
  path, trace = load(directory, earlier)
  return {**summarise(trace, steps, hlo_text=hlo_text), 'path': path}
