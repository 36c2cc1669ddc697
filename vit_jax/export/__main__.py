"""Command line of `vit_jax.export`: python -m vit_jax.export SOURCE OUT --format FORMAT."""

import argparse
import sys
from typing import Sequence

from vit_jax import entry, errors, files, runtime
from vit_jax.export import FORMATS, export
from vit_jax.export.source import DTYPES, Resize


def _floats(text: str) -> tuple[float, ...]:
  try:
    return tuple(float(part) for part in text.split(','))
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not comma-separated numbers, e.g. '
                                     '0.485,0.456,0.406') from None


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.export',
      description='Export a classifier (a workdir or a published .npz) or a translation '
                  "workdir's greedy translation for serving: StableHLO, a TensorFlow "
                  'SavedModel or ONNX, in the directory OUT with metadata.json.')
  parser.add_argument('source', help='a classification or translation workdir, or a '
                      'published-layout .npz')
  parser.add_argument('out', help='the directory to write')
  parser.add_argument('--format', dest='export_format', required=True, metavar='FORMAT',
                      help=f'one of {", ".join(FORMATS)}')
  parser.add_argument('--model', help='registry name of the model in a .npz SOURCE, e.g. '
                      'ViT-B_16')
  parser.add_argument('--ema', action='store_true', help="a workdir SOURCE: export its EMA "
                      'weights (trained with config.ema_decay > 0)')
  parser.add_argument('--batch-size', type=int, help='a fixed batch size (default: symbolic)')
  parser.add_argument('--dtype', default='float32', help=f'compute dtype: {", ".join(DTYPES)}')
  parser.add_argument('--preprocess', action='store_true',
                      help='take uint8 images of any size, resized and normalized as the eval '
                      'pipeline does (default: float32 model inputs, normalized)')
  parser.add_argument('--image-size', type=int, help="the model's input size (default: the "
                      "workdir's config, or the .npz's position embedding)")
  parser.add_argument('--pixel-mean', type=_floats, metavar='M[,M,M]',
                      help="a .npz SOURCE: the pixel mean its model was trained with, as "
                      "fractions of 255 (default 0.5; DeiT's: 0.485,0.456,0.406); a workdir's "
                      'comes from its config')
  parser.add_argument('--pixel-std', type=_floats, metavar='S[,S,S]',
                      help="a .npz SOURCE: the pixel standard deviation (default 0.5; DeiT's: "
                      '0.229,0.224,0.225)')
  parser.add_argument('--eval-resize', metavar='square|shorter_side',
                      help="a .npz SOURCE with --preprocess: resize both sides (default, Google's "
                      "ViT) or the shorter one, keeping the aspect ratio (DeiT, timm); a "
                      "workdir's comes from its config")
  parser.add_argument('--eval-interpolation', metavar='bilinear|bicubic',
                      help='a .npz SOURCE with --preprocess: the resize kernel, antialiased '
                      "(default bilinear; DeiT's: bicubic)")
  parser.add_argument('--eval-resize-ratio', type=float, metavar='R',
                      help='a .npz SOURCE with --preprocess: resize to image size * R, then take '
                      "the central crop (default 1; DeiT's: 1.1428571, 256 for 224)")
  parser.add_argument('--checkpoint-fallback', action='store_true',
                      help="a workdir SOURCE whose latest checkpoint cannot be read: export its "
                      'newest readable one')
  parser.add_argument('--overwrite', action='store_true',
                      help='replace an earlier export at OUT (nothing else)')
  args = parser.parse_args(argv)
  given = {field: value for field, value in (('ratio', args.eval_resize_ratio),
                                              ('how', args.eval_resize),
                                              ('interpolation', args.eval_interpolation))
           if value is not None}
  try:
    with files.full_disk_as_one_line(args.out):
      export(args.source, args.out, args.export_format, model_name=args.model, ema=args.ema,
             batch_size=args.batch_size, dtype=args.dtype, preprocess=args.preprocess,
             image_size=args.image_size, overwrite=args.overwrite, pixel_mean=args.pixel_mean,
             pixel_std=args.pixel_std, resize=Resize(**given) if given else None,
             fall_back=args.checkpoint_fallback)
  except errors.UserError as e:
    # The checkpoint readers name the trainer's flag; this program's is --checkpoint-fallback.
    message = str(e).replace('--config.checkpoint_fallback=True', '--checkpoint-fallback')
    print(f'error: {message}', file=sys.stderr)
    return 1
  print(f'Wrote {args.out}')
  return 0


if __name__ == '__main__':
  runtime.start_program()
  entry.run(main)
