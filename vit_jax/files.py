"""Files on any filesystem: local paths, and every scheme tf.io.gfile reaches.

`gs://`, `s3://`, `hdfs://`, TensorFlow's in-memory `ram://`, ...: anything with a
`SCHEME://` goes through tf.io.gfile (TensorFlow is imported on first use); local paths
use the os module. http(s) URLs can be read, not written. Reaching the remote ones (and
saying why not in one line) is `remote_files`'s.
"""

import contextlib
import errno
import glob as local_glob
import os
import shutil
import tempfile
import uuid
from typing import Callable, Iterator

from vit_jax import errors, remote_files

is_web, is_remote = remote_files.is_web, remote_files.is_remote  # Callers ask files.


def _check_writable(path: str):
  if is_web(path):
    raise errors.ConfigError(f'Cannot write to {path}: http(s) URLs are read-only.')


def absolute(path: str) -> str:
  """A local path made absolute (with ~ expanded); remote paths as they are."""
  path = os.fspath(path)
  return path if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def join(path: str, *names: str) -> str:
  return os.path.join(path, *names)


def exists(path: str) -> bool:
  path = os.fspath(path)
  if is_web(path):
    return False  # Unknown until read; read_bytes says if it is missing.
  if not is_remote(path):
    return os.path.exists(path)
  with remote_files.reaching(path):
    return remote_files.gfile().exists(path)


def isdir(path: str) -> bool:
  path = os.fspath(path)
  if is_web(path):
    return False
  if not is_remote(path):
    return os.path.isdir(path)
  with remote_files.reaching(path):
    return remote_files.gfile().isdir(path)


def makedirs(path: str):
  path = os.fspath(path)
  _check_writable(path)
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)
    return
  with remote_files.reaching(path):
    remote_files.gfile().makedirs(path)


def listdir(path: str) -> list[str]:
  """Names in directory `path` (no trailing '/'), sorted."""
  path = os.fspath(path)
  if not is_remote(path):
    return sorted(os.listdir(path))
  with remote_files.reaching(path):
    return sorted(name.rstrip('/') for name in remote_files.gfile().listdir(path))


def glob(pattern: str) -> list[str]:
  """Paths matching `pattern` (`*`, `?`, `[...]`), sorted."""
  pattern = os.fspath(pattern)
  if not is_remote(pattern):
    return sorted(local_glob.glob(os.path.expanduser(pattern)))
  with remote_files.reaching(pattern):
    return sorted(remote_files.gfile().glob(pattern))


def remove_tree(path: str):
  """Removes directory `path` and everything in it; nothing when it does not exist."""
  path = os.fspath(path)
  if is_remote(path):
    if remote_files.gfile().exists(path):
      remote_files.gfile().rmtree(path)
  else:
    shutil.rmtree(path, ignore_errors=True)


def open_file(path: str, mode: str = 'r'):
  """A file object, like `open` (text modes are UTF-8)."""
  path = os.fspath(path)
  if 'w' in mode or 'a' in mode:
    _check_writable(path)
  if is_remote(path):
    return remote_files.gfile().GFile(path, mode)
  return open(path, mode, encoding=None if 'b' in mode else 'utf-8')


def read_bytes(path: str) -> bytes:
  """The whole file: local, http(s) (urllib) or any tf.io.gfile scheme.

  Raises:
    MissingFileError: there is no such file.
  """
  path = os.fspath(path)
  if is_web(path):
    return remote_files.read_url(path)
  if not exists(path):
    raise errors.MissingFileError(f'{path} does not exist.')
  with remote_files.reaching(path), open_file(path, 'rb') as f:
    return f.read()


def read_text(path: str) -> str:
  return read_bytes(path).decode('utf-8')


def write_atomically(path: str, write: Callable[[str], None], *,
                     overwrite: bool = True) -> None:
  """Calls `write(local_tmp_path)`, then moves the file to `path` in one rename.

  Readers never see a partial file: a crash or error inside `write` leaves `path` as
  it was and removes the temporary file. Remote files are written locally, copied
  beside `path` and renamed.

  Raises:
    FileExistsError: `path` exists and `overwrite` is False.
  """
  path = os.fspath(path)
  _check_writable(path)
  if isdir(path):
    raise errors.ConfigError(f'{path} is a directory; give a file name.')
  if not overwrite and exists(path):
    raise FileExistsError(f'{path} already exists; pass overwrite=True (--overwrite on '
                          'the command line) to replace it.')
  if is_remote(path):
    gfile = remote_files.gfile()
    gfile.makedirs(os.path.dirname(path))
    with tempfile.TemporaryDirectory() as local_dir:
      local = os.path.join(local_dir, os.path.basename(path))
      write(local)
      remote_tmp = f'{path}.tmp-{uuid.uuid4().hex}'
      gfile.copy(local, remote_tmp, overwrite=True)
      try:
        gfile.rename(remote_tmp, path, overwrite=True)
      except BaseException:
        with contextlib.suppress(Exception):
          gfile.remove(remote_tmp)
        raise
    return
  directory = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{os.path.basename(path)}.',
                               suffix='.tmp')
  except OSError as error:
    raise cannot_write(path, error) from None
  os.close(fd)
  try:
    write(tmp)
    with open(tmp, 'rb') as f:
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # mkstemp makes it owner-only.
    os.replace(tmp, path)
  except BaseException as error:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    if is_disk_full(error):
      raise disk_full(path, error) from None
    raise


def write_bytes_atomically(path: str, data: bytes, *, overwrite: bool = True):
  def write(tmp):
    with open(tmp, 'wb') as f:
      f.write(data)
  write_atomically(path, write, overwrite=overwrite)


def write_text_atomically(path: str, text: str):
  write_bytes_atomically(path, text.encode('utf-8'))


def walk_files(directory: str) -> Iterator[str]:
  """Paths relative to `directory` of every file below it."""
  walk = remote_files.gfile().walk if is_remote(directory) else os.walk
  for root, _, names in walk(directory):
    for name in names:
      yield os.path.relpath(os.path.join(root, name), directory)


def copy_tree(source: str, destination: str):
  """Copies every file below `source` to the same place below `destination`."""
  gfile = remote_files.gfile() if is_remote(source) or is_remote(destination) else None
  for relative in walk_files(source):
    target = os.path.join(destination, relative)
    if gfile is None:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copyfile(os.path.join(source, relative), target)
    else:
      gfile.makedirs(os.path.dirname(target))
      gfile.copy(os.path.join(source, relative), target, overwrite=True)


def move_tree(source: str, destination: str):
  """Moves directory `source` to `destination` (a rename where the filesystem has one)."""
  if not is_remote(source) and not is_remote(destination):
    os.rename(source, destination)
    return
  copy_tree(source, destination)  # Object stores have no directory rename.
  remove_tree(source)


def cannot_write(path: str, error: OSError) -> errors.UserError:
  """The one-line error for an output that the filesystem refuses (no access, not a directory,
  no space)."""
  if is_disk_full(error):
    return disk_full(path, error)
  where = f' ({error.filename})' if error.filename and error.filename != path else ''
  # makedirs meets a file where a directory of the path should be.
  reason = 'not a directory' if isinstance(error, FileExistsError) else error.strerror or error
  return errors.ConfigError(f'Cannot write {path}: {reason}{where}; choose a path in a '
                            'directory you can write to.')


def is_disk_full(error: BaseException) -> bool:
  """True for a write that failed for want of space (a full disk, a quota, a size limit)."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
    return True
  return 'No space left on device' in str(error)  # Wrapped by a library (safetensors' I/O).


@contextlib.contextmanager
def full_disk_as_one_line(path: str | None = None):
  """Turns a write inside it that ran out of space into `disk_full`'s error, naming `path` (else
  the failing call's file, where it names one)."""
  try:
    yield
  except errors.DiskFullError:
    raise  # Named where it was written.
  except OSError as error:
    if not is_disk_full(error):
      raise
    raise disk_full(path or error.filename, error) from None


def disk_full(path: str | None, error: Exception) -> errors.DiskFullError:
  """The one-line error for an output that did not fit (`path` None where it is not known)."""
  what, free = 'the output', ''
  if path:
    what = str(path)
    with contextlib.suppress(OSError):
      directory = os.path.dirname(os.path.abspath(path))
      free = f', {shutil.disk_usage(directory).free / 2**20:,.1f} MiB free in {directory}'
  reason = getattr(error, 'strerror', None) or error
  return errors.DiskFullError(f'No space to write {what} ({reason}{free}): '
                              'free some space or write elsewhere, then run the same command '
                              'again.')


def check_can_make_dir(path: str, output: str | None = None):
  """Raises `cannot_write`'s error unless directory `path` exists or could be made (its nearest
  existing ancestor is a directory this process may write in); makes nothing. Local paths.
  The error names `output` (what will be written in `path`), else `path`."""
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise cannot_write(output or path, NotADirectoryError(20, 'Not a directory', existing))
  if not os.access(existing, os.W_OK | os.X_OK):
    raise cannot_write(output or path, PermissionError(13, 'Permission denied', existing))


def check_can_write_file(path: str):
  """`check_can_make_dir` for the file `path`: its directory could be made, and it is not one."""
  if os.path.isdir(path):
    raise cannot_write(path, IsADirectoryError(21, 'Is a directory'))
  check_can_make_dir(os.path.dirname(os.path.abspath(path)), output=path)


def staging_dir(path: str) -> str:
  """A new empty local directory beside `path`, for `replace_with_dir` to rename to it.

  Made with the permissions of any new directory (the umask's), as the output will be.
  """
  parent = os.path.dirname(os.path.abspath(path))
  staging = os.path.join(parent, f'.{os.path.basename(path)}.partial-{uuid.uuid4().hex[:8]}')
  try:
    os.makedirs(parent, exist_ok=True)
    os.mkdir(staging)
  except OSError as error:
    raise cannot_write(path, error) from None
  return staging


def replace_with_dir(staging: str, path: str):
  """Renames the directory `staging` to `path`. What was at `path` is moved aside first and
  removed once the rename is done, so a failure leaves it in place."""
  aside = None
  if os.path.lexists(path):
    aside = f'{staging}.replaced'
    os.replace(path, aside)
  try:
    os.replace(staging, path)
  except BaseException:
    if aside is not None:
      os.replace(aside, path)
    raise
  if aside is not None and os.path.isdir(aside) and not os.path.islink(aside):
    shutil.rmtree(aside)
  elif aside is not None:
    os.remove(aside)


def check_replaceable(path: str, what: str, looks_like: Callable[[str], bool]):
  """Raises unless `path`, which `--overwrite` would replace, is an earlier `what`.

  `looks_like(path)` tells an earlier output from anything else (a workdir, a folder of the
  user's); the current directory and those above it are never replaced.
  """
  real = os.path.realpath(path)
  if os.path.commonpath([real, os.path.realpath(os.getcwd())]) == real:
    raise errors.ConfigError(f'--overwrite would replace {path}, the current directory or one '
                             'above it; give a new directory for the output.')
  if not looks_like(path):
    raise errors.ConfigError(f'--overwrite replaces an earlier {what}, and {path} is not one; '
                             'remove it yourself, or give another path.')
