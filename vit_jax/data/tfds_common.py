"""TFDS helpers that the image and the text sources share: finding, preparing, sizing.

TensorFlow Datasets is imported inside each function, so importing this module is cheap.
"""

import difflib
from typing import Callable

import ml_collections

from vit_jax import errors, progress


def suggestion(name: str) -> str:
  """' Close TFDS names: a, b.' for a dataset name that TFDS does not know, or ''."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  base_name = name.split('/')[0].split(':')[0]  # Without '/config' or ':version'.
  close = difflib.get_close_matches(base_name, tfds.list_builders(), n=5, cutoff=0.6)
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
  if builder.is_prepared():
    return
  how = (f'Prepare it where there is network access (`tfds build {name} --data_dir=DIR`; '
         'manual datasets such as imagenet2012 need their archives in --manual_dir first), copy '
         'DIR to this machine and set config.data.tfds_data_dir=DIR.')
  where = f'{builder.data_dir} (config.data.tfds_data_dir={config.tfds_data_dir!r})'
  if not config.tfds_download:
    raise errors.DataUnavailableError(f'TFDS dataset {name!r} is not prepared in {where} and '
                                      f'config.data.tfds_download is False. {how}')
  # TFDS's downloader reads its retry count from this module constant at each download.
  from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top
  default_retries, downloader.MAX_RETRIES = downloader.MAX_RETRIES, config.tfds_download_retries
  try:
    with progress.phase(f'Preparing TFDS dataset {name} in {builder.data_dir} (download and '
                        'convert; this happens once; a failing download is retried '
                        f'{config.tfds_download_retries} times with growing waits, about 3.5 '
                        'minutes for 10, before the error: config.data.tfds_download_retries)'):
      builder.download_and_prepare(
          download_config=tfds.download.DownloadConfig(manual_dir=config.tfds_manual_dir))
  except Exception as e:  # Offline, missing manual files, ...: all end here.
    raise errors.DataUnavailableError(
        f'TFDS dataset {name!r} is not prepared in {where}, and preparing it failed '
        f'({type(e).__name__}: {e}). {how}') from e
  finally:
    downloader.MAX_RETRIES = default_retries
