"""`python -m vit_jax.models [NAME]`: the registered models, or one model's settings.

Without NAME, a line per model (family, width, depth, heads, patch size). With NAME, every
field a config can set (`--config.model.FIELD=VALUE`) with its value, and the parameter
count for the given input (`--image-size`, `--num-classes`; `--vocab-size` for Transformers).
"""

import argparse
import math
import sys

from vit_jax import entry, errors
from vit_jax.models import registry
from vit_jax.models.vit import stem_stride

IMAGE_SIZE, NUM_CLASSES, VOCAB_SIZE = 224, 1000, 32000  # The counts' defaults.


def _parameter_count(name: str, args) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  if name.startswith('Transformer'):
    model = registry.get_model(name, vocab_size=args.vocab_size)
    tokens = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, tokens))
  else:
    model = registry.get_model(name, num_classes=args.num_classes)
    images = jnp.zeros((1, args.image_size, args.image_size, 3))
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), images))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes['params']))


def _summary(name: str) -> str:
  settings = registry.model_config(name)
  if name.startswith('Transformer'):
    return (f'{name:19} Transformer  width {settings["embed_dim"]:4}  '
            f'layers {settings["num_layers"]}+{settings["num_layers"]}  '
            f'heads {settings["num_heads"]:2}  mlp {settings["mlp_dim"]}')
  pixels = settings['patch_size'][0] * stem_stride(settings['resnet_layers'])
  family = 'hybrid ViT' if settings['resnet_layers'] is not None else (
      'DeiT' if settings['classifier'] == 'token_distill' else 'ViT')
  return (f'{name:19} {family:11}  width {settings["hidden_size"]:4}  '
          f'layers {settings["num_layers"]:2}  heads {settings["num_heads"]:2}  '
          f'mlp {settings["mlp_dim"]:4}  patch {pixels}')


def _check(parser: argparse.ArgumentParser, args):
  """Fills in the counts' defaults; a usage error for a flag out of range, or one that does not
  apply to the model (or to the list of models)."""
  ranges = {'image_size': (IMAGE_SIZE, 1), 'num_classes': (NUM_CLASSES, 0),
            'vocab_size': (VOCAB_SIZE, 1)}
  transformer = args.name is not None and registry.model_family(args.name) == 'Transformer'
  takes = ('--vocab-size',) if transformer else ('--image-size', '--num-classes')
  for name, (default, least) in ranges.items():
    flag, value = '--' + name.replace('_', '-'), getattr(args, name)
    if value is not None and args.name is None:
      parser.error(f'{flag} applies to the parameter count of one model: name it, e.g. '
                   f'{"Transformer-base" if name == "vocab_size" else "ViT-B_16"} {flag} '
                   f'{value}')
    if value is not None and flag not in takes:
      parser.error(f'{flag} does not apply to {args.name}, a '
                   f'{"Transformer" if transformer else "ViT"}: its count takes '
                   f'{" and ".join(takes)}')
    if value is not None and value < least:
      parser.error(f'invalid {flag} {value} (expected an integer >= {least})')
    setattr(args, name, default if value is None else value)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m vit_jax.models', description=__doc__.split(
      '\n')[0])
  parser.add_argument('name', nargs='?', help='a registered model, e.g. ViT-B_16')
  parser.add_argument('--image-size', type=int,
                      help=f'ViT: input side for the count (default: {IMAGE_SIZE})')
  parser.add_argument('--num-classes', type=int,
                      help=f'ViT: classes for the count, 0 for no head (default: {NUM_CLASSES})')
  parser.add_argument('--vocab-size', type=int,
                      help=f'Transformer: vocabulary for the count (default: {VOCAB_SIZE})')
  args = parser.parse_args(argv)
  try:
    _check(parser, args)
    if args.name is None:
      for name in registry.model_names():
        print(_summary(name))
      return 0
    fields = registry.model_fields(args.name)
    print(_summary(args.name))
    for field in fields:
      print(f'  --config.model.{field.name}={field.default!r}')
    what = (f'vocabulary {args.vocab_size}' if args.name.startswith('Transformer') else
            f'{args.image_size}x{args.image_size} input, '
            + (f'{args.num_classes} classes' if args.num_classes else 'no head: pooled features'))
    print(f'{_parameter_count(args.name, args):,} parameters ({what})')
  except errors.UserError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  entry.run(main)
