"""Reaching files that are not local: tf.io.gfile's filesystems and http(s) URLs, with their
failures (no network, no access, no such filesystem) as one-line errors."""

import contextlib
import os
import re

from vit_jax import errors, native_logs

_WEB = ('http://', 'https://')
_WEB_TIMEOUT_S = 60  # Seconds without a byte before an http(s) read gives up.


def is_web(path: str | os.PathLike) -> bool:
  """True for http:// and https:// URLs (read with urllib, never written)."""
  return os.fspath(path).startswith(_WEB)


def is_remote(path: str | os.PathLike) -> bool:
  """True for `SCHEME://...` paths (gs://, ram://, http://, ...)."""
  return '://' in os.fspath(path)


def gfile():
  """tf.io.gfile, TensorFlow imported on first use."""
  try:
    from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.ConfigError('Remote paths (gs://, s3://, ...) need TensorFlow '
                             '(tf.io.gfile): install tensorflow-cpu, or copy the files to '
                             'a local path.') from e
  return tf.io.gfile


# TensorFlow's GCS filesystem logs this C++ warning at its first request without credentials,
# which public buckets (gs://vit_models) need none of; a private bucket's access error says it.
_NO_CREDENTIALS = re.compile(r'[WE]\d{4} [\d:. ]+\d+ google_auth_provider\.cc:\d+\] All attempts '
                             'to get a Google authentication bearer token failed')
_gcs_used = False


@contextlib.contextmanager
def reaching(path: str):
  """Turns a remote filesystem's failure (no network, no access) into a one-line error."""
  global _gcs_used
  first_gcs_request = os.fspath(path).startswith('gs://') and not _gcs_used
  _gcs_used = _gcs_used or first_gcs_request
  with without_credentials_warning() if first_gcs_request else contextlib.nullcontext():
    with _one_line_errors(path):
      yield


@contextlib.contextmanager
def without_credentials_warning():
  """Drops TensorFlow's warning that GCS found no credentials from what is written to stderr
  inside it; every other line passes."""
  lines = []
  try:
    with native_logs.stderr_captured() as lines:
      yield
  finally:
    native_logs.pass_on(lines, _NO_CREDENTIALS)


@contextlib.contextmanager
def _one_line_errors(path: str):
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except  # tf.errors.OpError and kin.
    if not is_remote(path) or type(e).__module__.split('.')[0] != 'tensorflow':
      raise
    if type(e).__name__ == 'NotFoundError':
      raise errors.MissingFileError(f'{path} does not exist.') from None
    if type(e).__name__ == 'UnimplementedError':  # "File system scheme 's3' not implemented".
      scheme = os.fspath(path).split('://')[0]
      raise errors.ConfigError(
          f'Cannot read {path}: TensorFlow (tf.io.gfile) has no filesystem for {scheme}:// here '
          '(it has gs:// and ram://; tensorflow-io adds s3://, hdfs:// and others): install '
          'tensorflow-io, or copy the file to a local path.') from None
    message = ' '.join(getattr(e, 'message', str(e)).split())
    raise errors.DataUnavailableError(
        f'Cannot reach {path}: {message}. Check the network connection and the credentials '
        '(for gs://: gcloud auth application-default login), or copy the file to a local '
        'path.') from None



def read_url(url: str) -> bytes:
  """The whole file at an http(s) URL; its failures as one line (a 404 as MissingFileError)."""
  import urllib.error  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top
  try:
    with urllib.request.urlopen(url, timeout=_WEB_TIMEOUT_S) as response:
      return response.read()
  except urllib.error.HTTPError as e:
    if e.code == 404:
      raise errors.MissingFileError(f'{url} does not exist (HTTP 404).') from None
    raise errors.DataUnavailableError(f'Cannot read {url}: HTTP {e.code} {e.reason}. Check '
                                      'the URL, or copy the file to a local path.') from None
  except OSError as e:  # URLError (no network, refused), a timeout, a dropped connection.
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    raise errors.DataUnavailableError(
        f'Cannot reach {url}: {reason}. Check the network connection (and https_proxy where '
        'one is needed), or copy the file to a local path.') from None
