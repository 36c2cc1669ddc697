"""Command line: write an image folder of digits, for trying image-folder training offline.

  python -m vit_jax.data.make_image_folder --out=data/digits32 [--size 32]
      [--train_size 5000] [--test_size 1000] [--seed 0] [--overwrite]

writes OUT/{train,test}/<digit>/<n>.png: grayscale PNGs of scikit-learn's 1,797 8x8 digits,
upscaled to SIZE px, each a random variant (rotation, scale, shift, pixel noise) of one
original. The originals are split first (360 test, 1,437 train), so no test image is a
variant of a train digit. The same flags give the same files.
"""

import argparse
import os
import shutil
import sys
from typing import Sequence

import numpy as np
from PIL import Image

from vit_jax import entry, errors, files
from vit_jax.data import digits

MAX_ROTATION = 12.0  # Degrees, either way.
SCALES = (0.85, 1.05)  # Zoom of the upscaled digit, which fills 8/10 of the side.
MAX_SHIFT = 0.08  # Of the side, in x and in y.
NOISE = 8.0  # Standard deviation of the added Gaussian pixel noise, in 0..255 levels.


def variant(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """One random (size, size) uint8 variant of an 8x8 uint8 digit."""
  # A black border first, so that the strokes that touch the 8x8 frame fade out when resized.
  big = Image.fromarray(np.pad(image, 1)).resize((size, size), Image.BICUBIC)
  angle = np.deg2rad(rng.uniform(-MAX_ROTATION, MAX_ROTATION))
  scale = rng.uniform(*SCALES)
  shift = rng.uniform(-MAX_SHIFT, MAX_SHIFT, 2) * size
  # PIL maps each output pixel to an input one: the inverse of scale-rotate-shift about the centre.
  cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
  centre = (size - 1) / 2
  x0, y0 = centre + shift
  inverse = (cos, sin, centre - cos * x0 - sin * y0, -sin, cos, centre + sin * x0 - cos * y0)
  moved = np.asarray(big.transform((size, size), Image.AFFINE, inverse, Image.BILINEAR),
                     dtype=np.float32)
  return np.clip(np.round(moved + rng.normal(0, NOISE, moved.shape)), 0, 255).astype(np.uint8)


def write_split(folder: str, images: np.ndarray, labels: np.ndarray, count: int, size: int,
                rng: np.random.Generator):
  """`count` variants in folder/<label>/<n>.png, cycling through the originals in turn."""
  for label in np.unique(labels):
    os.makedirs(os.path.join(folder, str(label)), exist_ok=True)
  for n in range(count):
    i = n % len(images)
    path = os.path.join(folder, str(labels[i]), f'{n:05d}.png')
    Image.fromarray(variant(images[i], size, rng)).save(path)


def make(out: str, size: int = 32, train_size: int = 5000, test_size: int = 1000,
         seed: int = 0, overwrite: bool = False):
  """Writes the folder; a bad value, an existing OUT/train or OUT/test, or an OUT the
  filesystem refuses (a file in its path, no access, a full disk) raises a UserError."""
  for name, value, low in (('size', size, 8), ('train_size', train_size, 1),
                           ('test_size', test_size, 1)):
    if value < low:
      raise errors.ConfigError(f'--{name}={value}: expected an integer >= {low}.')
  existing = [path for path in (os.path.join(out, 'train'), os.path.join(out, 'test'))
              if os.path.exists(path)]
  if existing and not overwrite:
    raise errors.ConfigError(f'{existing[0]} already exists: pass --overwrite to replace '
                             f'{" and ".join(existing)}, or choose another --out.')
  originals = digits.splits(seed)
  try:
    for path in existing:
      shutil.rmtree(path)
    for index, (split, count) in enumerate((('train', train_size), ('test', test_size))):
      images, labels = originals[split]
      # A generator per split: the test images are the same whatever --train_size is.
      rng = np.random.default_rng([seed, index])
      write_split(os.path.join(out, split), images, labels, count, size, rng)
  except OSError as error:
    raise files.cannot_write(out, error) from None


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.data.make_image_folder',
      description="Write OUT/{train,test}/<digit>/*.png: scikit-learn's 8x8 digits upscaled "
                  'with random rotations, scales, shifts and noise; test and train images '
                  'come from disjoint original digits.')
  parser.add_argument('--out', required=True, help='the folder to write')
  parser.add_argument('--size', type=int, default=32, help='image side in pixels (>= 8)')
  parser.add_argument('--train_size', type=int, default=5000, help='train images')
  parser.add_argument('--test_size', type=int, default=1000, help='test images')
  parser.add_argument('--seed', type=int, default=0, help='the split and the variants')
  parser.add_argument('--overwrite', action='store_true',
                      help='replace an existing OUT/train and OUT/test')
  args = parser.parse_args(argv)
  try:
    make(args.out, args.size, args.train_size, args.test_size, args.seed, args.overwrite)
  except errors.UserError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  print(f'Wrote {args.train_size} train and {args.test_size} test images '
        f'({args.size}x{args.size}, 10 classes) to {args.out}')
  return 0


if __name__ == '__main__':
  entry.run(main)
