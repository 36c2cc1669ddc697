"""Preparing a TFDS dataset that is not on disk: no minutes of retries where it cannot download."""

import subprocess
import sys

import pytest

from helpers import REPO, data_config
from vit_jax import errors
from vit_jax.data import tfds_common

PROXY_VARIABLES = ('http_proxy', 'https_proxy', 'all_proxy', 'HTTP_PROXY', 'HTTPS_PROXY',
                   'ALL_PROXY')
UNRESOLVABLE_URL = 'https://downloads.example.invalid/tiny.tar.gz'  # .invalid never resolves.


class UnpreparedBuilder:
  """A TFDS builder's surface as `prepare` uses it; its download prints what TFDS's prints (a
  line on stdout, progress bars on stderr), raises `failure`, if any, and records the retry
  count TFDS's downloader would use."""

  def __init__(self, tmp_path, url: str, failure: Exception | None = None):
    self.data_dir = tmp_path / 'tfds' / 'tiny' / '1.0.0'
    self.url_infos = {url: None}
    self.failure = failure
    self.retries = []

  def is_prepared(self) -> bool:
    return False

  def download_and_prepare(self, download_config=None):
    del download_config
    from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top
    from tensorflow_datasets.core.utils import tqdm_utils  # pylint: disable=g-import-not-at-top
    self.retries.append(downloader.MAX_RETRIES)
    print(f'Downloading and preparing dataset Unknown size to {self.data_dir}...')
    with tqdm_utils.async_tqdm(total=1, desc='Dl Completed...', unit=' url') as bar:
      bar.update(0)
    if self.failure:
      raise self.failure


@pytest.fixture(name='no_proxy')
def no_proxy_fixture(monkeypatch):
  for variable in PROXY_VARIABLES:
    monkeypatch.delenv(variable, raising=False)


def _prepare(builder, **config):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds_common.prepare(builder, 'tiny', data_config(dataset='tiny', **config), tfds)


def test_a_host_that_does_not_resolve_is_not_retried(tmp_path, no_proxy):
  del no_proxy
  builder = UnpreparedBuilder(tmp_path, UNRESOLVABLE_URL, ConnectionError('Failed to resolve'))
  with pytest.raises(errors.DataUnavailableError) as error:
    _prepare(builder)
  assert builder.retries == [0]  # Not the 10 that took 3.5 minutes.
  message = str(error.value)
  assert "'tiny' is not prepared in" in message
  assert 'download host downloads.example.invalid does not resolve (no network?)' in message
  assert 'tfds build tiny --data_dir=DIR' in message and 'tfds_data_dir=DIR' in message


def test_an_attempt_that_cannot_download_prints_no_tfds_progress(tmp_path, no_proxy, capfd):
  del no_proxy
  with pytest.raises(errors.DataUnavailableError):
    _prepare(UnpreparedBuilder(tmp_path, UNRESOLVABLE_URL, ConnectionError('Failed to resolve')))
  out, err = capfd.readouterr()
  assert (out, err) == ('', '')
  _prepare(UnpreparedBuilder(tmp_path, 'http://localhost/tiny.tar.gz'))  # It can download.
  out, err = capfd.readouterr()
  assert 'Downloading and preparing dataset' in out and 'Dl Completed...' in err


def test_a_manual_dataset_prepares_offline(tmp_path, no_proxy):
  del no_proxy
  builder = UnpreparedBuilder(tmp_path, UNRESOLVABLE_URL)  # Its archives are in a manual folder.
  _prepare(builder)
  assert builder.retries == [0]
  missing = AssertionError('Manual directory /data/manual does not exist or is empty.')
  with pytest.raises(errors.DataUnavailableError, match='Manual directory /data/manual does not'):
    _prepare(UnpreparedBuilder(tmp_path, UNRESOLVABLE_URL, missing))


def test_a_resolving_host_is_retried(tmp_path, no_proxy):
  del no_proxy
  builder = UnpreparedBuilder(tmp_path, 'http://localhost/tiny.tar.gz', ConnectionError('reset'))
  with pytest.raises(errors.DataUnavailableError, match=r'preparing it failed \(ConnectionError'):
    _prepare(builder, tfds_download_retries=3)
  assert builder.retries == [3]


def test_behind_a_proxy_the_download_is_retried(tmp_path, monkeypatch, no_proxy):
  del no_proxy
  monkeypatch.setenv('https_proxy', 'http://127.0.0.1:9')
  builder = UnpreparedBuilder(tmp_path, UNRESOLVABLE_URL)
  _prepare(builder)
  assert builder.retries == [10]


def test_an_unprepared_dataset_is_one_line_on_the_command_line(tmp_path):
  """The README's configs/vit.py (cifar10) where it is not on disk: TFDS's 'Variant folder
  ... has no dataset_info.json' warning does not precede the error."""
  out = subprocess.run([sys.executable, '-m', 'vit_jax.main',
                        '--config=configs/vit.py:ViT-testing,cifar10',
                        f'--workdir={tmp_path / "run"}',
                        f'--config.data.tfds_data_dir={tmp_path / "tfds"}',
                        '--config.data.tfds_download=False'],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode != 0
  assert out.stderr.splitlines() == [out.stderr.strip()], out.stderr
  assert out.stderr.startswith("error: TFDS dataset 'cifar10' is not prepared in "), out.stderr
