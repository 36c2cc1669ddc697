"""scikit-learn's embedded 8x8 digits (1,797 images, 10 classes), the data that needs no download.

Read from the CSV file scikit-learn installs, without importing scikit-learn: importing it
(and SciPy with it) takes longer than the read. An installation without that file is read
through `sklearn.datasets.load_digits`.
"""

import gzip
import importlib.util
import os

import numpy as np

NUM_DIGITS = 1797  # In scikit-learn's file.
NUM_TEST = 360  # Of the NUM_DIGITS; the other 1,437 are the train split.
_CSV = ('datasets', 'data', 'digits.csv.gz')  # Inside the sklearn package.


def _csv_path() -> str | None:
  spec = importlib.util.find_spec('sklearn')
  for folder in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(folder, *_CSV)
    if os.path.exists(path):
      return path
  return None


def originals() -> tuple[np.ndarray, np.ndarray]:
  """All the digits: uint8 images (1797, 8, 8), the 0..16 levels scaled to 0..255; int64 labels."""
  path = _csv_path()
  if path:
    with gzip.open(path) as csv:
      rows = np.loadtxt(csv, delimiter=',')  # (1797, 65): 64 pixel levels, then the label.
    levels, labels = rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(np.int64)
  else:
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    levels, labels = digits.images, digits.target.astype(np.int64)
  return np.round(levels * (255.0 / 16.0)).astype(np.uint8), labels


def split_ids(seed: int) -> dict[str, np.ndarray]:
  """{'train', 'test'}: disjoint indices of the NUM_DIGITS digits, NUM_TEST of them test."""
  order = np.random.default_rng(seed).permutation(NUM_DIGITS)
  return {'train': order[NUM_TEST:], 'test': order[:NUM_TEST]}


def splits(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{'train' | 'test': (uint8 images (N, 8, 8), int64 labels (N,))}, split by `split_ids`."""
  images, labels = originals()
  return {split: (images[ids], labels[ids]) for split, ids in split_ids(seed).items()}
