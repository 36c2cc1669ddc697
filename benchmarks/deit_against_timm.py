"""A DeiT's predictions here against timm's own, from the same weights and the same images.

  pip install torch timm   # for this comparison only; never a dependency of vit_jax
  python benchmarks/deit_against_timm.py [--model deit_tiny_distilled_patch16_224]

No download: timm builds the model with a seeded random init (its head scaled so that the
classes differ), saves its state_dict as .safetensors; `python -m vit_jax.convert` turns it
into a .npz, and `python -m vit_jax.main --config=configs/deit.py --config.trainer=predict`
predicts 8 pictures of ImageNet's usual shapes (500x375, 375x500, 500x333, ..., one
square), which timm predicts through its own eval transform
(`resolve_data_config`, `create_transform`). Printed per setting: the largest difference of
the class probabilities (the mean of the two heads, as both report) and the top-1 agreement.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMM_CROP = ['--config.data.eval_resize_ratio=1.1071429']  # 248 / 224: timm's crop_pct 0.9.
OURS = {  # vit_jax settings compared, as command-line overrides of configs/deit.py.
    "configs/deit.py at timm's crop (resize 248, as floor(224 / 0.9), central 224)": TIMM_CROP,
    '  but bilinear (eval_interpolation=bilinear)': [
        *TIMM_CROP, '--config.data.eval_interpolation=bilinear'],
    '  but square (eval_resize=square)': [*TIMM_CROP, '--config.data.eval_resize=square'],
    "  but the ViT default statistics (inputs in [-1, 1])": [
        *TIMM_CROP, '--config.data.pixel_mean=(0.5,)', '--config.data.pixel_std=(0.5,)'],
    "configs/deit.py as it is (DeiT's own crop: resize 256, central 224)": [],
}


SHAPES = [(500, 375), (375, 500), (500, 333), (333, 500), (640, 480), (480, 640), (300, 224),
          (224, 224)]  # (width, height)


def _pictures(directory: str) -> list[str]:
  """RGB pictures of SHAPES: random colours, 8x8 (smooth) or 48x48 (detailed), upsampled."""
  rng = np.random.default_rng(0)
  paths = []
  for i, shape in enumerate(SHAPES):
    side = 8 if i % 2 else 48
    small = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    paths.append(os.path.join(directory, f'picture_{i}.png'))
    small.resize(shape, Image.BICUBIC).save(paths[-1])
  return paths


def _run(*args: str) -> str:
  result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          check=False)
  if result.returncode:
    sys.exit(f'{" ".join(args)} failed:\n{result.stderr}')
  return result.stdout


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='deit_tiny_distilled_patch16_224',
                      help='a timm distilled DeiT at 224 px')
  parser.add_argument('--ours', default='DeiT-Ti_16', help='its vit_jax registry name')
  args = parser.parse_args()
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  model = timm.create_model(args.model, pretrained=False, num_classes=10).eval()
  with torch.no_grad():  # A random head of a scale at which the classes differ.
    for weight in (model.head.weight, model.head_dist.weight):
      weight.normal_(0, 0.5)
  data_config = timm.data.resolve_data_config({}, model=model)
  transform = timm.data.create_transform(**data_config)
  print(f'timm {timm.__version__} {args.model}: {data_config}')
  with tempfile.TemporaryDirectory() as directory:
    state = os.path.join(directory, 'deit.safetensors')
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, state)
    npz = os.path.join(directory, 'deit.npz')
    _run('-m', 'vit_jax.convert', state, npz, '--model', args.ours)
    paths = _pictures(directory)
    with torch.no_grad():
      images = torch.stack([transform(Image.open(path).convert('RGB')) for path in paths])
      logits = model(images)  # Eval mode: the mean of the two heads.
    theirs = torch.softmax(logits, -1).numpy()
    output = os.path.join(directory, 'ours.jsonl')
    for name, overrides in OURS.items():
      _run('-m', 'vit_jax.main', f'--config=configs/deit.py:{args.ours},cifar10',
           '--config.trainer=predict', f'--config.pretrained={npz}',
           '--config.predict.top_k=10', f'--config.predict.inputs={",".join(paths)}',
           f'--config.predict.output_file={output}', *overrides)
      with open(output, encoding='utf-8') as f:
        rows = [json.loads(line) for line in f]
      ours = np.array([[p['probability'] for p in sorted(row['predictions'],
                                                          key=lambda p: p['class'])]
                       for row in rows])
      agree = int((ours.argmax(1) == theirs.argmax(1)).sum())
      print(f'{name}: max |p_vit_jax - p_timm| {np.abs(ours - theirs).max():.4f}, top-1 '
            f'agrees on {agree}/{len(paths)}')


if __name__ == '__main__':
  main()
