"""TFDS helpers that the image and the text sources share: finding, preparing, sizing.

TensorFlow Datasets is imported inside each function, so importing this module is cheap.
"""

import contextlib
import difflib
import io
import logging
import socket
import urllib.parse
import urllib.request
from typing import Callable

import ml_collections

from vit_jax import errors, progress, remote_files


def suggestion(name: str) -> str:
  """' Close TFDS names: a, b.' for a dataset name that TFDS does not know, or ''.

  TFDS lists its community datasets from a public GCS bucket, which needs no credentials:
  TensorFlow's warning that it found none is left out.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  base_name = name.split('/')[0].split(':')[0]  # Without '/config' or ':version'.
  with remote_files.without_credentials_warning():
    known = tfds.list_builders()
  close = difflib.get_close_matches(base_name, known, n=5, cutoff=0.6)
  return f' Close TFDS names: {", ".join(close)}.' if close else ''


def find_builder(name: str, data_dir: str | None,
                 unknown_error: Callable[[Exception], Exception]):
  """`tfds.builder(name)`; a name TFDS does not know raises `unknown_error(tfds_error)`."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError as e:
    raise unknown_error(e) from None
  except ValueError as e:
    if not str(e).startswith('Parsing builder name string'):
      raise  # E.g. an unknown config of a known dataset: TFDS's message lists the close ones.
    raise unknown_error(e) from None


class _VariantFolderFilter(logging.Filter):
  """Drops TFDS's 'Variant folder DIR has no dataset_info.json': an unprepared dataset's
  version folder, which `prepare` explains or prepares."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith('Variant folder ')


@contextlib.contextmanager
def _no_variant_folder_warnings():
  logger, variant_filter = logging.getLogger('absl'), _VariantFolderFilter()
  logger.addFilter(variant_filter)
  try:
    yield
  finally:
    logger.removeFilter(variant_filter)


def split_size(builder, split) -> int:
  """Number of examples in a TFDS split string / sub-split, from metadata when it has it."""
  if builder.info.splits:  # Empty under tfds.testing.mock_data: fall back to counting.
    try:
      return builder.info.splits[split].num_examples
    except (KeyError, ValueError) as e:
      raise errors.ConfigError(f'Split {split!r} is not valid for TFDS dataset {builder.name!r}, '
                               f'whose splits are {sorted(builder.info.splits)}: {e}') from e
  cardinality = int(builder.as_dataset(split=split).cardinality())
  if cardinality >= 0:
    return cardinality
  return sum(1 for _ in builder.as_dataset(split=split))


def prepare(builder, name: str, config: ml_collections.ConfigDict, tfds):
  """Runs download_and_prepare if needed, or explains how to prepare the dataset elsewhere."""
  with _no_variant_folder_warnings():
    if builder.is_prepared():
      return
  how = (f'Prepare it where there is network access (`tfds build {name} --data_dir=DIR`; '
         'manual datasets such as imagenet2012 need their archives in --manual_dir first), copy '
         'DIR to this machine and set config.data.tfds_data_dir=DIR.')
  where = f'{builder.data_dir} (config.data.tfds_data_dir={config.tfds_data_dir!r})'
  if not config.tfds_download:
    raise errors.DataUnavailableError(f'TFDS dataset {name!r} is not prepared in {where} and '
                                      f'config.data.tfds_download is False. {how}')
  # Where no download host resolves (offline), each retry fails the same way for minutes: none
  # are made. A dataset read from a manual folder may still prepare without the network.
  unreachable = _unresolvable_hosts(builder)
  retries = 0 if unreachable else config.tfds_download_retries
  # TFDS's downloader reads its retry count from this module constant at each download.
  from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top
  default_retries, downloader.MAX_RETRIES = downloader.MAX_RETRIES, retries
  try:
    if unreachable:
      when_failing = 'its download hosts do not resolve here, so a failing download is not retried'
    else:
      when_failing = (f'a failing download is retried {retries} times with growing waits, about '
                      '3.5 minutes for 10, before the error: config.data.tfds_download_retries')
    with progress.phase(f'Preparing TFDS dataset {name} in {builder.data_dir} (download and '
                        f'convert; this happens once; {when_failing})'):
      with _tfds_quiet(tfds) if unreachable else contextlib.nullcontext():
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=config.tfds_manual_dir))
  except OSError as e:  # requests' ConnectionError is one.
    if not unreachable:
      raise _preparing_failed(name, where, how, e) from e
    raise errors.DataUnavailableError(
        f'TFDS dataset {name!r} is not prepared in {where}, and it cannot be downloaded here: '
        f'{_none_resolves(unreachable)} (no network?). {how}') from e
  except Exception as e:  # Missing manual files, a corrupt download, ...: all end here.
    raise _preparing_failed(name, where, how, e) from e
  finally:
    downloader.MAX_RETRIES = default_retries


@contextlib.contextmanager
def _tfds_quiet(tfds):
  """Without TFDS's 'Downloading and preparing' line and progress bars: for an attempt that
  cannot download, whose outcome the error (or the phase's last line) says."""
  from tensorflow_datasets.core.utils import tqdm_utils  # pylint: disable=g-import-not-at-top
  bars_shown = getattr(tqdm_utils, '_active', True)
  tfds.display_progress_bar(False)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    tfds.display_progress_bar(bars_shown)


def _preparing_failed(name: str, where: str, how: str, e: Exception) -> Exception:
  return errors.DataUnavailableError(f'TFDS dataset {name!r} is not prepared in {where}, and '
                                     f'preparing it failed ({type(e).__name__}: {e}). {how}')


def _unresolvable_hosts(builder) -> list[str]:
  """The download hosts of `builder`, sorted, where none of them resolves; else [].

  Not checked behind a proxy, which resolves the names itself.
  """
  if urllib.request.getproxies():
    return []
  urls = getattr(builder, 'url_infos', None) or {}
  hosts = sorted({urllib.parse.urlsplit(url).hostname for url in urls} - {None})
  for host in hosts:
    try:
      socket.getaddrinfo(host, None)
      return []
    except (socket.gaierror, UnicodeError):
      continue
  return hosts


def _none_resolves(hosts: list[str]) -> str:
  if len(hosts) == 1:
    return f'the name of its download host {hosts[0]} does not resolve'
  return f'none of the names of its download hosts ({", ".join(hosts)}) resolves'
