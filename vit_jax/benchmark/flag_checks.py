"""The benchmark's flags checked together, before anything is built: ranges, combinations, the
model's family against --mode, and the files it will write. Each problem is one usage line."""

import argparse

from vit_jax import errors, files
from vit_jax.benchmark import data_input
from vit_jax.models import registry
from vit_jax.models.attention import ATTENTION_IMPLEMENTATIONS

# The model a mode times when --model is not given.
DEFAULT_MODELS = {'seq2seq': 'Transformer-base'}
DEFAULT_MODEL = 'ViT-B_16'
# Flags (their argparse names) and the least value each takes; None: not given, which is fine.
MINIMUMS = {
    'batch': 1, 'steps': 1, 'warmup': 0, 'rounds': 1, 'resolution': 1, 'trace_steps': 1,
    'beam_size': 0, 'seq_len': 1, 'sentence_length': 1, 'decode_length': 1, 'vocab_size': 1,
    'num_images': 1, 'compile_repeats': 1, 'num_layers': 1, 'embed_dim': 1, 'mlp_dim': 1,
    'num_heads': 1}
POSITIVE_NUMBERS = ('feed', 'peak_tflops')
# Flags that shape one family of models only.
SEQ2SEQ_ONLY = ('embed_dim', 'mlp_dim')


def _flag(name: str) -> str:
  return '--' + name.replace('_', '-')


def _out_of_range(args: argparse.Namespace) -> list[str]:
  wrong = [f'{_flag(name)} {getattr(args, name)} (expected an integer >= {least})'
           for name, least in MINIMUMS.items()
           if getattr(args, name) is not None and getattr(args, name) < least]
  wrong += [f'{_flag(name)} {getattr(args, name):g} (expected a number > 0)'
            for name in POSITIVE_NUMBERS
            if getattr(args, name) is not None and not getattr(args, name) > 0]
  if not args.resolutions or min(args.resolutions) < 1:
    wrong.append(f'--resolutions {",".join(map(str, args.resolutions))} (expected image sides '
                 '>= 1, e.g. 256,512)')
  return wrong


def _check_model(args: argparse.Namespace):
  """Picks the mode's default model; raises ConfigError when --model is not of the mode's kind."""
  if args.model is None:
    args.model = DEFAULT_MODELS.get(args.mode, DEFAULT_MODEL)
  if args.mode == 'data' or args.compile_depth:
    return  # Neither builds --model.
  family = registry.model_family(args.model)  # Unknown names: the registry's error.
  seq2seq = args.mode == 'seq2seq' and not args.attention_memory
  wanted = 'Transformer' if seq2seq else 'VisionTransformer'
  if family != wanted:
    kind = [name for name in registry.MODELS if registry.model_family(name) == wanted]
    what = ('--mode seq2seq times a seq2seq Transformer' if seq2seq else
            f'{"--attention-memory" if args.attention_memory else f"--mode {args.mode}"} '
            'times an image model')
    hint = ' (or --mode seq2seq for it)' if family == 'Transformer' else ''
    raise errors.ConfigError(f'{what}, but --model {args.model} is not one: choose one of '
                             f'{", ".join(kind)}{hint}.')
  given = [_flag(name) for name in SEQ2SEQ_ONLY if getattr(args, name) is not None]
  if given and not seq2seq:
    raise errors.ConfigError(f'{" and ".join(given)} shape(s) the seq2seq Transformer '
                             f'(--mode seq2seq); --model {args.model} takes its own widths.')


def _check_outputs(args: argparse.Namespace):
  """Raises cannot_write's error now for a --json or --hlo-out file or a --trace directory that
  could not be written at the end of the run."""
  for path in (args.json, args.hlo_out):
    if path:
      files.check_can_write_file(path)
  if args.trace:
    files.check_can_make_dir(args.trace)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace):
  """Ends the program with a usage line (parser.error) at the first problem of `args`."""
  wrong = _out_of_range(args)
  if wrong:
    parser.error(f'invalid {", ".join(wrong)}')
  peer = {'seq2seq': 'torch', 'data': None}.get(args.mode, 'timm')
  if args.compare and peer is None:
    parser.error(f'--compare does not apply to --mode {args.mode}')
  if args.compare and args.compare != peer:
    parser.error(f'--compare {args.compare} does not apply to --mode {args.mode}; '
                 f'use --compare {peer}')
  if args.profile and (args.mode != 'seq2seq' or args.compare):
    parser.error('--profile applies to --mode seq2seq, without --compare')
  if args.trace:
    clashing = [flag for flag, on in (
        ('--profile', args.profile), ('--mode data', args.mode == 'data'),
        ('--attention-memory', args.attention_memory),
        ('--compile-depth', args.compile_depth)) if on]
    if clashing:
      parser.error(f'--trace does not combine with {", ".join(clashing)}')
  if args.compile_for:
    clashing = [flag for flag, on in (
        ('--compare', args.compare), ('--trace', args.trace), ('--profile', args.profile),
        ('--packed', args.packed), ('--mode data', args.mode == 'data'),
        ('--attention-memory', args.attention_memory),
        ('--compile-depth', args.compile_depth), ('--matmul blas', args.matmul == 'blas'))
                if on]
    if clashing:
      parser.error(f'--compile-for does not combine with {", ".join(clashing)}')
    args.matmul = 'xla'  # The GPU's products: XLA's, not this CPU's BLAS.
  if args.hlo_out and (args.mode == 'data' or args.profile or args.attention_memory
                       or args.compile_depth):
    parser.error('--hlo-out applies to --mode infer, train and seq2seq')
  if args.timing != 'auto' and (args.mode == 'data' or args.compile_for
                                or args.attention_memory or args.compile_depth):
    parser.error('--timing applies to the timed steps of --mode infer, train and seq2seq')
  unknown = [v for v in args.variants if v not in data_input.VARIANTS]
  if unknown:
    parser.error(f'--variants: unknown {unknown}; choose from {list(data_input.VARIANTS)}')
  unknown = [i for i in args.memory_impls if i not in ATTENTION_IMPLEMENTATIONS]
  if unknown:
    parser.error(f'--memory-impls: unknown {unknown}; choose from {ATTENTION_IMPLEMENTATIONS}')
  try:
    _check_model(args)
    _check_outputs(args)
  except errors.ConfigError as error:
    parser.error(str(error))
