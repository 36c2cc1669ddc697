"""The command line: flags, the benchmark they select, the title line, the JSON file.

`--xla-option NAME=VALUE` (repeatable) compiles everything we measure with that XLA option,
e.g. `--xla-option xla_cpu_experimental_ynn_fusion_type=` runs XLA:CPU's dots on Eigen
instead of YNNPACK; comparing ours/timm across runs shows what an option is worth.

`--trace DIR` (infer, train, seq2seq) records `--trace-steps` more of our step (seq2seq:
the train step) with the JAX profiler under DIR after the timed ones, and prints (and
puts in the JSON under 'trace') where their op time goes; see `vit_jax.benchmark.trace`.

`--compile-for h200` (infer, train, seq2seq) compiles our step for that GPU without one and
prints what its kernels must move and compute, and the roofline bound of the step
(`vit_jax.benchmark.gpu_target`, `vit_jax.benchmark.hlo_costs`); nothing runs. `--hlo-out
FILE` writes the compiled step's optimised HLO (of any run) for `python -m
vit_jax.benchmark.hlo_costs FILE` to read later.

`--matmul` chooses who multiplies the float32 matrices of the Dense layers: 'xla'
(XLA:CPU's own kernels), 'blas' (MKL or OpenBLAS through `vit_jax.kernels.blas`) or
'auto' (the trainer's default: where MKL is installed, MKL on Intel CPUs, and on AMD CPUs
XLA's products with attention on MKL); everything
runs inside `vit_jax.kernels.use(matmul, dropout_masks)`, as in the trainer. The title
line shows what ran. FLOPs on the BLAS count like XLA's. `--dropout-masks` chooses where
dropout's masks come from, as `config.dropout_masks`: 'hash' (the default) or 'jax'.

On CPUs, as in the trainer (`config.tune_malloc`), glibc is told to keep freed
memory, so that XLA's temporary buffer is not freshly mapped (and page-faulted) at
every step; see `vit_jax.runtime.tune_malloc`. It applies to the whole process, timm
included; `--no-tune-malloc` measures without it.
"""

import argparse
import json
import os
import re
import sys
from typing import Sequence

from vit_jax import errors, files, kernels, runtime
from vit_jax.benchmark import report as report_lib
from vit_jax.benchmark import timing
from vit_jax.benchmark.attention_memory import benchmark_attention_memory
from vit_jax.benchmark.compile_depth import benchmark_compile_depth
from vit_jax.benchmark import data_input, flag_checks, gpu_target
from vit_jax.benchmark.seq2seq import benchmark_seq2seq
from vit_jax.benchmark.seq2seq_profile import benchmark_seq2seq_profile
from vit_jax.benchmark.steps import DTYPES
from vit_jax.benchmark.vit import benchmark_vit
from vit_jax.kernels import blas
from vit_jax.models.attention import ATTENTION_IMPLEMENTATIONS, resolve_attention_impl


def _attention_name(args, backend: str | None = None) -> str:
  """The --attention choice, with the kernel it resolves to (on `backend`) when that differs."""
  kernel = resolve_attention_impl(args.attention, backend=backend, dtype=DTYPES[args.dtype])
  return args.attention if kernel == args.attention else f'{args.attention} ({kernel})'


def _matmul_name(args) -> str:
  """The --matmul choice, with what it resolves to (and the BLAS library) here."""
  resolved = blas.resolve_matmul(args.matmul, dtype=DTYPES[args.dtype])
  if resolved == 'blas':
    resolved = f'blas: {blas.load().name}'
  return args.matmul if resolved == args.matmul else f'{args.matmul} ({resolved})'


def _state_dtype_note(args) -> str:
  if args.mode == 'infer' or args.optimizer_state_dtype == 'float32':
    return ''
  return f' | optimizer state {args.optimizer_state_dtype}'


def _int_list(text: str) -> list[int]:
  try:
    return [int(x) for x in text.split(',') if x]
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not comma-separated integers, e.g. '
                                     '256,512') from None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows defaults, except None (a flag not given: its help says what happens then)."""

  def _get_help_string(self, action):
    return action.help if action.default is None else super()._get_help_string(action)


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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.benchmark',
      description='Throughput, FLOP/s, MFU and memory of vit_jax models (optionally '
                  'against timm), attention memory, and compile time against depth.',
      formatter_class=_HelpFormatter)
  parser.add_argument('--model', help='registry name (default: '
                      f'{flag_checks.DEFAULT_MODELS["seq2seq"]} for --mode seq2seq, else '
                      f'{flag_checks.DEFAULT_MODEL})')
  parser.add_argument('--mode', default='infer', choices=('infer', 'train', 'seq2seq', 'data'),
                      help='data: images/s of the train input pipeline on JPEG files')
  parser.add_argument('--batch', type=int, default=8, help='examples per step')
  parser.add_argument('--resolution', type=int, default=224, help='image side (pixels)')
  parser.add_argument('--dtype', default='float32', choices=tuple(DTYPES),
                      help='compute dtype (params stay float32; timm runs under autocast)')
  parser.add_argument('--steps', type=int, default=20, help='timed steps per implementation')
  parser.add_argument('--warmup', type=int, default=3, help='untimed steps after compiling')
  parser.add_argument('--rounds', type=int, default=5,
                      help='alternation rounds the timed steps are split into')
  parser.add_argument('--timing', default='auto', choices=timing.TIMINGS,
                      help="'pipelined': the next step is queued before waiting for one, as in "
                      "training; 'isolated': each step starts when the one before is ready "
                      "(its time includes launching it); 'auto': isolated on CPUs, else "
                      'pipelined')
  parser.add_argument('--compare', choices=('timm', 'torch'),
                      help='also time the peer: timm (infer, train) or torch.nn.Transformer '
                      '(seq2seq)')
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
                      help="Dense products: XLA's kernels, a BLAS (MKL/OpenBLAS; bfloat16 on "
                      "MKL only), or 'auto' (MKL on Intel CPUs, for bfloat16 where they have "
                      "AMX; on AMD, float32 attention alone on MKL)")
  parser.add_argument('--dropout-masks', default='hash', choices=kernels.DROPOUT_MASKS,
                      help="dropout's random masks: a counter hash, or jax.random.bernoulli "
                      '(threefry)')
  parser.add_argument('--num-layers', type=int, help='override the model\'s depth')
  parser.add_argument('--embed-dim', type=int, help='seq2seq: override the model\'s width')
  parser.add_argument('--mlp-dim', type=int, help='seq2seq: override the MLP width')
  parser.add_argument('--num-heads', type=int, help='override the number of heads')
  parser.add_argument('--scan-layers', action='store_true',
                      help='the layers as one scanned layer (as config.model.scan_layers)')
  parser.add_argument('--remat', action='store_true',
                      help='recompute activations in the backward pass (as config.model.remat)')
  parser.add_argument('--seq-len', type=int, default=64, help='seq2seq source/target length')
  parser.add_argument('--packed', action='store_true',
                      help='seq2seq: train on packed rows of random sentence pairs, as the '
                      'trainer does (torch gets padded rows of pairs of similar length)')
  parser.add_argument('--profile', action='store_true',
                      help='seq2seq: time the parts of a train step (attention, loss, '
                      'optimizer, dropout, ...) instead')
  parser.add_argument('--sentence-length', type=int, default=12,
                      help='seq2seq --packed: typical sentence length in tokens')
  parser.add_argument('--decode-length', type=int, default=64,
                      help='seq2seq: tokens generated per greedy decode')
  parser.add_argument('--vocab-size', type=int, default=32000, help='seq2seq: vocabulary size')
  parser.add_argument('--images', help='data: an image folder DIR/train/<class>/*.{jpg,jpeg,png} '
                      'to read (default: JPEGs of ImageNet size written for the run)')
  parser.add_argument('--num-images', type=int, default=256,
                      help='data: JPEG files to write when --images is not given')
  parser.add_argument('--variants', type=lambda text: text.split(','),
                      default=list(data_input.VARIANTS),
                      help='data: comma-separated pipelines to time, of '
                      f'{",".join(data_input.VARIANTS)}')
  parser.add_argument('--feed', type=float, default=3000.0,
                      help='data: the images/s a train step consumes, for the cores needed to '
                      'feed it (default: ViT-B/16 bf16 on one H200)')
  parser.add_argument('--trace', metavar='DIR',
                      help='infer, train, seq2seq (its train step): after the timed steps, '
                      'record --trace-steps more of our step with the JAX profiler under DIR '
                      'and print where their time goes (GPU kernels, else the XLA ops of CPU '
                      'threads, library calls named by their target)')
  parser.add_argument('--trace-steps', type=int, default=5, help='--trace: steps recorded')
  parser.add_argument('--compile-for', choices=tuple(gpu_target.TARGETS),
                      help='infer, train, seq2seq (its train step): compile our step for this '
                      'GPU without one (needs JAX\'s CUDA plugin) and print its kernels\' '
                      'bytes, FLOPs and roofline bound instead of timing it')
  parser.add_argument('--hlo-out', metavar='FILE',
                      help="infer, train, seq2seq (its train step): write our compiled step's "
                      'optimised HLO text to FILE')
  parser.add_argument('--beam-size', type=int, default=4,
                      help='seq2seq: also time beam-search decoding with this many beams '
                      '(0 skips it)')
  parser.add_argument('--optimizer-state-dtype', default='float32', choices=tuple(DTYPES),
                      help="train, seq2seq: dtype of AdamW's first moment (the optimizer "
                      "config's state_dtype)")
  parser.add_argument('--attention-memory', action='store_true',
                      help='memory of the attention paths at growing token counts')
  parser.add_argument('--resolutions', type=_int_list, default=[256, 512, 768, 1024],
                      help='--attention-memory: comma-separated image sides')
  parser.add_argument('--memory-impls', type=lambda s: s.split(','),
                      default=['plain', 'fused', 'chunked'],
                      help='--attention-memory: attention paths to compare')
  parser.add_argument('--compile-depth', action='store_true',
                      help='compile time of --depth-model (scanned) vs 4 layers')
  parser.add_argument('--depth-model', default='ViT-H_14',
                      help='--compile-depth: the deep model compiled')
  parser.add_argument('--compile-repeats', type=int, default=2,
                      help='--compile-depth: compiles timed per model (the least is kept)')
  parser.add_argument('--no-unrolled', action='store_true',
                      help='--compile-depth: skip compiling the deep model unrolled')
  args = parser.parse_args(argv)
  flag_checks.check(parser, args)
  try:
    args.xla_options = parse_xla_options(args.xla_option)  # Typed, for the compiler.
  except ValueError as error:
    parser.error(str(error))
  return args


def run(args: argparse.Namespace) -> tuple[dict, str]:
  """Runs the benchmark `args` select; returns (all figures, the printed table)."""
  platform = timing.device_info()['platform']
  args.timing = timing.resolve_timing(args.timing, platform)
  with kernels.use(args.matmul, args.dropout_masks):
    report, text, title = _run(args)
  if args.timing != timing.resolve_timing('auto', platform):  # Chosen on the command line.
    title += f' | {args.timing} steps'
  if args.xla_option:
    title += ' | XLA ' + ' '.join(args.xla_option)
  info = timing.device_info()
  if 'cpu_cores' in info:
    where = f'cpu ({info["cpu_cores"]} cores'
    load = info.get('load_average_1min')
    where += ')' if load is None else f', load average {load:.1f} at the end)'
  else:
    where = f'{info["platform"]} ({info["device_kind"]}, {info["device_count"]} device(s))'
  text = f'{title} | {where}\n{text}'
  if 'trace' in report:
    text += '\n\n' + report_lib.format_trace(report['trace'])
  report = {'args': {k: v for k, v in vars(args).items()}, 'device': info, **report}
  return report, text


def _run(args: argparse.Namespace) -> tuple[dict, str, str]:
  """(figures, table, title) of the benchmark `args` select."""
  if args.compile_for:
    report = gpu_target.compile_for(args)
    text = report_lib.format_compile_for(report)
    what = f'batch {args.batch} | ' + (f'source/target {args.seq_len}' if args.mode == 'seq2seq'
                                       else f'{args.resolution}px')
    title = (f'{args.model} {args.mode} | {what} | {args.dtype} | compiled for '
             f'{report["device_name"]} without one (attention {_attention_name(args, "gpu")}, '
             'products on cuBLAS)' + _state_dtype_note(args))
    return report, text, title
  if args.attention_memory:
    report = benchmark_attention_memory(args)
    text = report_lib.format_attention_memory(report, args.memory_impls)
    title = f'{args.model} forward memory by attention path ({args.dtype})'
  elif args.compile_depth:
    report = benchmark_compile_depth(args)
    text = report_lib.format_compile_depth(report)
    title = f'compile time against depth ({args.depth_model}, batch {args.batch}, ' \
            f'{args.resolution}px, {args.dtype})'
  elif args.mode == 'data':
    report = data_input.benchmark_data(args)
    text = report_lib.format_data(report)
    title = (f'train input | {args.resolution}px | batch {args.batch} | {report["num_files"]} '
             f'{report["file_formats"]} files, {report["mean_file_kb"]:.0f} KB on average | '
             'inception crop, flip')
  elif args.mode == 'seq2seq':
    if args.profile:
      report = benchmark_seq2seq_profile(args)
      text = report_lib.format_seq2seq_profile(report)
    else:
      report = benchmark_seq2seq(args)
      text = report_lib.format_seq2seq(report)
    rows = (f'packed rows of {args.seq_len} (sentences ~{args.sentence_length})'
            if args.packed else f'source/target {args.seq_len}')
    mode = 'seq2seq profile' if args.profile else 'seq2seq'
    title = (f'{args.model} {mode} | batch {args.batch} | {rows} | '
             f'decode {args.decode_length} | vocab {args.vocab_size} | {args.dtype} | '
             f'matmul {_matmul_name(args)} | dropout masks {args.dropout_masks}'
             + _state_dtype_note(args))
  else:
    report = benchmark_vit(args)
    text = report_lib.format_vit(report)
    title = (f'{args.model} {args.mode} | batch {args.batch} | {args.resolution}px | '
             f'{args.dtype} | attention {_attention_name(args)} | matmul {_matmul_name(args)}'
             + (' | scan' if args.scan_layers else '') + (' | remat' if args.remat else '')
             + (' | tuned malloc' if args.tune_malloc else '') + _state_dtype_note(args))
  return report, text, title


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.compare:  # Leave GPU memory to torch: JAX would take 75% of it at start-up.
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  if args.tune_malloc is None:  # Decided before JAX starts its threads (see tune_malloc).
    args.tune_malloc = runtime.jax_runs_on_cpu()
  if args.tune_malloc and not runtime.tune_malloc():
    print('note: --tune-malloc needs glibc (Linux); running without it.', file=sys.stderr)
    args.tune_malloc = False
  if args.compile_for:
    gpu_target.start_jax()
  try:
    report, text = run(args)
  except errors.UserError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  print(text)
  if args.json:
    try:
      files.write_text_atomically(args.json, json.dumps(report, indent=2, default=str))
    except OSError as error:  # Checked writable at the start; the disk may have filled since.
      print(f'error: {files.cannot_write(args.json, error)}', file=sys.stderr)
      return 1
    print(f'Wrote {args.json}')
  return 0
