"""`python -m vit_jax.benchmark --mode data`: the train input pipeline's images/s."""

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from vit_jax.benchmark import cli, data_input

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark(*args):
  return subprocess.run([sys.executable, '-m', 'vit_jax.benchmark', '--mode', 'data', *args],
                        capture_output=True, text=True, cwd=REPO, check=False)


def test_written_jpegs_have_imagenet_sizes(tmp_path):
  data_input.write_jpegs(str(tmp_path), 4)
  train = sorted((tmp_path / 'train').glob('*/*.jpg'))
  assert len(train) == 4 and len(list((tmp_path / 'test').glob('*/*.jpg'))) == 2
  assert {Image.open(path).size for path in train} == {(500, 375), (375, 500)}
  assert all(50_000 < path.stat().st_size < 200_000 for path in train)


def test_data_mode_times_a_variant_on_one_core_and_all(tmp_path):
  report = tmp_path / 'report.json'
  result = _benchmark('--num-images', '8', '--batch', '4', '--steps', '1', '--warmup', '1',
                      '--resolution', '32', '--variants', '+randaugment',
                      '--feed', '1000', '--json', str(report))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'train input | 32px | batch 4 | 8 JPEG files' in result.stdout
  assert 'cores for 1,000/s' in result.stdout
  assert 'first batch when resuming at step 0 / 10,000 / 1,000,000: ' in result.stdout
  figures = json.loads(report.read_text())
  assert list(figures['first_batch_s']) == ['0', '10000', '1000000']
  rows = figures['rows']
  assert [row['variant'] for row in rows] == ['+randaugment']
  for row in rows:
    assert row['per_core'] > 0 and row['all_cores'] > 0
    assert row['cores_to_feed'] == pytest.approx(1000 / row['per_core'])


def test_the_title_names_the_files_formats():
  # A folder of PNGs was called '300 JPEG files'.
  assert data_input.file_formats(['a/0/x.png', 'a/1/y.PNG']) == 'PNG'
  assert data_input.file_formats(['x.jpg', 'y.jpeg', 'z.JPG']) == 'JPEG'
  assert data_input.file_formats(['x.jpg', 'y.png']) == 'JPEG and PNG'


def test_data_mode_mistakes_are_named(tmp_path):
  result = _benchmark('--images', str(tmp_path))
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith(
      f'error: --images {tmp_path}: expected a folder DIR/train/<class>/*.{{jpg,jpeg,png}}')
  with pytest.raises(SystemExit):
    cli.parse_args(['--mode', 'data', '--variants', 'crop+flip,sharpen'])
  with pytest.raises(SystemExit):
    cli.parse_args(['--mode', 'data', '--compare', 'timm'])
