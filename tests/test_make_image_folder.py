"""`python -m vit_jax.data.make_image_folder`: the layout, the same files for the same flags,
test images made only from test originals, and a bad flag as a one-line error."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from helpers import user_error
from PIL import Image

from vit_jax import errors
from vit_jax.data import digits, images, make_image_folder

REPO = pathlib.Path(__file__).resolve().parents[1]


def _files(root: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob('*.png'))}


def test_layout_sizes_and_images(tmp_path):
  make_image_folder.make(str(tmp_path), size=28, train_size=30, test_size=12)
  for split, count in (('train', 30), ('test', 12)):
    assert sorted(p.name for p in (tmp_path / split).iterdir()) == [str(d) for d in range(10)]
    paths = sorted((tmp_path / split).glob('*/*.png'))
    assert len(paths) == count
    image = Image.open(paths[0])
    assert image.mode == 'L' and image.size == (28, 28)
    assert np.asarray(image).max() > 128  # A digit, not a blank.
  dataset = images.build({'dataset': str(tmp_path), 'image_size': 28}, 0, 1)  # The trainer's.
  assert dataset.num_classes == 10
  assert (dataset.num_train_examples, dataset.num_test_examples) == (30, 12)


def test_same_flags_same_files_another_seed_others(tmp_path):
  for name, seed in (('a', 0), ('b', 0), ('c', 1)):
    make_image_folder.make(str(tmp_path / name), train_size=20, test_size=10, seed=seed)
  assert _files(tmp_path / 'a') == _files(tmp_path / 'b')
  assert _files(tmp_path / 'a') != _files(tmp_path / 'c')
  make_image_folder.make(str(tmp_path / 'd'), train_size=5, test_size=10)
  assert _files(tmp_path / 'd/test') == _files(tmp_path / 'a/test')  # Whatever the train size.


def test_test_images_come_from_other_originals_than_train_images(tmp_path):
  ids = digits.split_ids(seed=0)
  assert len(ids['test']) == digits.NUM_TEST == 360
  assert not set(ids['train']) & set(ids['test'])
  assert sorted([*ids['train'], *ids['test']]) == list(range(1797))
  # Image n of a split is a variant of that split's original n % N: its class folder says so.
  originals = digits.splits(seed=0)
  make_image_folder.make(str(tmp_path), size=16, train_size=40, test_size=40)
  for split, (_, labels) in originals.items():
    for path in (tmp_path / split).glob('*/*.png'):
      assert path.parent.name == str(labels[int(path.stem) % len(labels)])


def test_an_existing_folder_is_kept_unless_overwrite(tmp_path):
  make_image_folder.make(str(tmp_path), train_size=3, test_size=2)
  with pytest.raises(errors.ConfigError, match='--overwrite'):
    make_image_folder.make(str(tmp_path), train_size=4, test_size=2)
  make_image_folder.make(str(tmp_path), train_size=4, test_size=2, overwrite=True)
  assert len(list((tmp_path / 'train').glob('*/*.png'))) == 4


def test_an_out_the_filesystem_refuses_is_a_one_line_error(tmp_path, capsys):
  (tmp_path / 'file').write_text('')
  out = f'{tmp_path}/file/images'
  message = f'Cannot write {out}: Not a directory; choose a path in a directory you can write to.'
  with pytest.raises(errors.UserError) as raised:
    make_image_folder.make(out, train_size=3, test_size=2)
  assert str(raised.value) == message
  assert make_image_folder.main([f'--out={out}', '--train_size=3', '--test_size=2']) == 1
  assert capsys.readouterr().err == f'error: {message}\n'


@pytest.mark.parametrize('flag,message', [
    ('--train_size=0', '--train_size=0: expected an integer >= 1.'),
    ('--size=4', '--size=4: expected an integer >= 8.'),
])
def test_a_bad_flag_is_a_one_line_error(tmp_path, flag, message):
  out = subprocess.run([sys.executable, '-m', 'vit_jax.data.make_image_folder',
                        f'--out={tmp_path}/x', flag], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
  assert out.returncode == 1
  assert user_error(out.stderr) == f'error: {message}'
  assert not (tmp_path / 'x').exists()
