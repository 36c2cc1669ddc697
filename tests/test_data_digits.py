"""The embedded digits, read from scikit-learn's CSV file without importing scikit-learn."""

import subprocess
import sys

import numpy as np

from vit_jax.data import digits


def _sklearn_digits():
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  raw = datasets.load_digits()
  return np.round(raw.images * (255.0 / 16.0)).astype(np.uint8), raw.target


def test_the_digits_are_scikit_learns_scaled_to_255():
  images, labels = digits.originals()
  expected_images, expected_labels = _sklearn_digits()
  assert images.shape == (1797, 8, 8) and images.dtype == np.uint8 and images.max() == 255
  np.testing.assert_array_equal(images, expected_images)
  np.testing.assert_array_equal(labels, expected_labels)
  assert labels.dtype == np.int64


def test_without_the_csv_file_scikit_learn_reads_them(monkeypatch):
  monkeypatch.setattr(digits, '_CSV', ('datasets', 'data', 'no_such_file.csv.gz'))
  images, labels = digits.originals()
  expected_images, expected_labels = _sklearn_digits()
  np.testing.assert_array_equal(images, expected_images)
  np.testing.assert_array_equal(labels, expected_labels)
  assert labels.dtype == np.int64


def test_reading_them_does_not_import_scikit_learn():
  # Importing scikit-learn (and SciPy) would add about a second to every digits run's start.
  check = ('import sys; from vit_jax.data import digits; digits.originals(); '
           "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
  out = subprocess.run([sys.executable, '-c', check], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]', out.stderr
