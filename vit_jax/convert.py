"""Command line: convert ViT weights between `.npz`, timm `.safetensors` and orbax workdirs.

  python -m vit_jax.convert SRC DST [--model NAME] [--overwrite] [--ema]
  python -m vit_jax.convert --print SRC

chooses the formats from the paths (`.npz`: published layout, `.safetensors`: timm
layout, a directory: a vit_jax workdir). The work is `vit_jax.weights.conversion`.
"""

import argparse
import os
import sys
from typing import Sequence

from vit_jax import entry, errors, runtime, weights


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.convert',
      description='Convert ViT checkpoints between the published .npz layout, timm '
                  '.safetensors and orbax (a vit_jax workdir); formats come from the paths.')
  parser.add_argument('src', help='checkpoint to read (.npz, .safetensors or a workdir)')
  parser.add_argument('dst', nargs='?', help='where to write (.npz, .safetensors or a '
                      'directory for orbax)')
  parser.add_argument('--model', help='registry model name, e.g. ViT-B_16; needed to read '
                      'a timm file, and checks the converted parameters when given')
  parser.add_argument('--overwrite', action='store_true',
                      help='replace an existing DST file, or a directory that convert wrote')
  parser.add_argument('--print', dest='print_names', action='store_true',
                      help='list the names and shapes of the arrays in SRC and exit')
  parser.add_argument('--checkpoint-fallback', action='store_true',
                      help="a workdir SRC whose latest checkpoint cannot be read: take its "
                      'newest readable one')
  parser.add_argument('--ema', action='store_true',
                      help='a workdir SRC: convert its EMA weights (trained with '
                      'config.ema_decay > 0)')
  args = parser.parse_args(argv)
  try:
    if args.print_names:
      weights.print_names(args.src, fall_back=args.checkpoint_fallback)
      return 0
    if args.dst is None:
      parser.error('give DST, or --print to list the arrays of SRC')
    weights.convert_file(args.src, args.dst, model=args.model, overwrite=args.overwrite,
                         fall_back=args.checkpoint_fallback, ema=args.ema)
  except BrokenPipeError:  # `--print ... | head`: the reader has all it wants.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
  except (errors.UserError, FileExistsError) as e:
    # The checkpoint readers name the trainer's flag; this program's is --checkpoint-fallback.
    message = str(e).replace('--config.checkpoint_fallback=True', '--checkpoint-fallback')
    print(f'error: {message}', file=sys.stderr)
    return 1
  print(f'Wrote {args.dst}')
  if weights.file_format(args.src) == 'safetensors' and (args.model or '').startswith('DeiT'):
    print("note: Facebook's DeiT weights expect ImageNet's pixel statistics: train with "
          "configs/deit.py (which sets them) or --config.data.pixel_mean='(0.485,0.456,0.406)' "
          "--config.data.pixel_std='(0.229,0.224,0.225)'; export a .npz with --pixel-mean "
          '0.485,0.456,0.406 --pixel-std 0.229,0.224,0.225 (and with --preprocess, DeiT\'s '
          'resize: --eval-resize shorter_side --eval-interpolation bicubic --eval-resize-ratio '
          '1.1428571).')
  return 0


if __name__ == '__main__':
  runtime.start_program()
  entry.run(main)
