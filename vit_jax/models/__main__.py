"""`python -m vit_jax.models [NAME]`: the registered models, or one model's settings.

Without NAME, a line per model (family, width, depth, heads, patch size). With NAME, every
field a config can set (`--config.model.FIELD=VALUE`) with its value, and the parameter
count for the given input (`--image-size`, `--num-classes`; `--vocab-size` for Transformers).
"""

import argparse
import math
import sys

from vit_jax import errors
from vit_jax.models import registry
from vit_jax.models.vit import stem_stride


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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m vit_jax.models', description=__doc__.split(
      '\n')[0])
  parser.add_argument('name', nargs='?', help='a registered model, e.g. ViT-B_16')
  parser.add_argument('--image-size', type=int, default=224, help='input side for the count')
  parser.add_argument('--num-classes', type=int, default=1000, help='classes for the count')
  parser.add_argument('--vocab-size', type=int, default=32000, help='Transformer vocabulary')
  args = parser.parse_args(argv)
  try:
    if args.name is None:
      for name in registry.model_names():
        print(_summary(name))
      return 0
    fields = registry.model_fields(args.name)
    print(_summary(args.name))
    for field in fields:
      print(f'  --config.model.{field.name}={field.default!r}')
    what = (f'vocabulary {args.vocab_size}' if args.name.startswith('Transformer') else
            f'{args.image_size}x{args.image_size} input, {args.num_classes} classes')
    print(f'{_parameter_count(args.name, args):,} parameters ({what})')
  except errors.UserError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
