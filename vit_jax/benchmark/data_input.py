"""`--mode data`: images/s of the trainer's own train input pipeline, reading JPEG files.

Each variant is `images.build(...).train_batches(...)` on an image folder at the model
resolution: read, decode, inception crop, flip (as ImageNet recipes train), then with
RandAugment, mixup, both, or random erasing. Each is measured once in a fresh process pinned to
one core (images/s per core: TensorFlow sizes its thread pools to the cores it may use), and
once in this process on all cores. Last, the first batch is timed when resuming at steps 0 to
1,000,000: the stream starts where it stopped, without reading what came before. The folder is
`--images DIR` (DIR/train/<class>/*.{jpg,jpeg,png}), or JPEGs written for the run at ImageNet's
typical size: 500x375 and 375x500, about 100 KB each.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from vit_jax import errors, progress

VARIANTS = {  # name -> data config overrides on top of crop + flip.
    'crop+flip': {},
    '+randaugment': {'randaugment_layers': 2, 'randaugment_magnitude': 10},
    '+mixup': {'mixup_alpha': 0.2},
    '+randaugment+mixup': {'randaugment_layers': 2, 'randaugment_magnitude': 10,
                           'mixup_alpha': 0.2},
    '+erasing': {'random_erasing_prob': 0.25},  # DeiT's share.
    # The crop resized bicubic and antialiased, as timm's and DeiT's (configs/deit.py).
    'bicubic-crop+flip': {'train_interpolation': 'bicubic'},
}
IMAGE_SIZES = ((375, 500), (500, 375))  # (height, width): ImageNet's most common shapes.
RESUME_STEPS = (0, 10_000, 1_000_000)  # Resumed at these steps, the first batch is timed.


def write_jpegs(directory: str, num_images: int, seed: int = 0) -> str:
  """Writes DIR/{train,test}/{0,1}/*.jpg photos-like in size and entropy; returns DIR."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  for split, count in (('train', num_images), ('test', 2)):
    for i in range(count):
      height, width = IMAGE_SIZES[i % len(IMAGE_SIZES)]
      # Smooth colour fields with texture: about the file size of a JPEG photo at quality 90.
      coarse = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), np.uint8)
      base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
      pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
      class_dir = os.path.join(directory, split, str(i % 2))
      os.makedirs(class_dir, exist_ok=True)
      Image.fromarray(pixels).save(os.path.join(class_dir, f'{i:05d}.jpg'), quality=90)
  return directory


def measure(folder: str, variant: str, resolution: int, batch: int, steps: int,
            warmup: int) -> dict:
  """Images/s of `variant`'s train batches (numpy, as the trainer takes them), in this process."""
  from vit_jax.data import images  # pylint: disable=g-import-not-at-top
  config = images.default_config()
  config.update(dataset=folder, image_size=resolution, train_crop='inception_crop', flip=True,
                **VARIANTS[variant])
  stream = images.build(config, process_index=0, process_count=1).train_batches(batch, seed=0)
  for _ in range(warmup):
    next(stream)
  start = time.perf_counter()
  for _ in range(steps):
    next(stream)
  seconds = time.perf_counter() - start
  return {'images_per_s': steps * batch / seconds, 'seconds': seconds}


def first_batch_seconds(folder: str, resolution: int, batch: int, start_step: int) -> float:
  """Seconds from asking for the stream at `start_step` to its first batch (crop+flip)."""
  from vit_jax.data import images  # pylint: disable=g-import-not-at-top
  config = images.default_config()
  config.update(dataset=folder, image_size=resolution, train_crop='inception_crop', flip=True)
  dataset = images.build(config, process_index=0, process_count=1)
  next(dataset.train_batches(batch, seed=0))  # Traces and warms up once.
  start = time.perf_counter()
  next(dataset.train_batches(batch, seed=0, start_step=start_step))
  return time.perf_counter() - start


def _in_process(args, folder: str, variant: str, cores: set[int]) -> dict:
  """`measure` in a fresh Python process pinned to `cores`."""
  command = [sys.executable, '-m', 'vit_jax.benchmark.data_input', folder, variant,
             str(args.resolution), str(args.batch), str(args.steps), str(args.warmup),
             ','.join(map(str, sorted(cores)))]
  environment = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'}
  result = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
  if result.returncode:
    raise RuntimeError(f'Measuring {variant} failed:\n{result.stderr[-4000:]}')
  return json.loads(result.stdout.strip().splitlines()[-1])


def file_formats(paths: list[str]) -> str:
  """What the files are, by their names' endings: 'JPEG', 'PNG', 'JPEG and PNG'."""
  endings = {os.path.splitext(path)[1].lstrip('.').upper() for path in paths} - {''}
  return ' and '.join(sorted({'JPEG' if e == 'JPG' else e for e in endings})) or 'image'


def benchmark_data(args) -> dict:
  """Per-core and all-core images/s of each variant, and the cores that feed `args.feed`."""
  cores = sorted(os.sched_getaffinity(0))
  with tempfile.TemporaryDirectory() as scratch:
    if args.images:
      folder = os.path.expanduser(args.images)
      if not os.path.isdir(os.path.join(folder, 'train')):
        raise errors.ConfigError(f'--images {args.images}: expected a folder DIR/train/<class>/'
                                 '*.{jpg,jpeg,png} (and DIR/test/...), as config.data.dataset '
                                 'takes.')
    else:
      with progress.phase(f'Writing {args.num_images} JPEG files'):
        folder = write_jpegs(scratch, args.num_images)
    found = [os.path.join(root, name)
             for root, _, names in os.walk(os.path.join(folder, 'train')) for name in names]
    sizes = [os.path.getsize(path) for path in found]
    rows = []
    for variant in args.variants:
      with progress.phase(f'Timing {variant} on one core, then on {len(cores)}'):
        one = _in_process(args, folder, variant, {cores[0]})
        everything = measure(folder, variant, args.resolution, args.batch, args.steps,
                             args.warmup)
      rows.append({'variant': variant, 'per_core': one['images_per_s'],
                   'all_cores': everything['images_per_s'],
                   'cores_to_feed': args.feed / one['images_per_s']})
    with progress.phase('Timing the first batch after resuming'):
      resume = {str(step): first_batch_seconds(folder, args.resolution, args.batch, step)
                for step in RESUME_STEPS}
  return {'rows': rows, 'cores': len(cores), 'feed': args.feed, 'num_files': len(sizes),
          'file_formats': file_formats(found),
          'mean_file_kb': float(np.mean(sizes)) / 1024, 'first_batch_s': resume}


def main(argv):
  folder, variant, resolution, batch, steps, warmup, cores = argv
  os.sched_setaffinity(0, {int(core) for core in cores.split(',')})  # Before TF sizes its pools.
  figures = measure(folder, variant, int(resolution), int(batch), int(steps), int(warmup))
  print(json.dumps(figures))


if __name__ == '__main__':
  main(sys.argv[1:])
