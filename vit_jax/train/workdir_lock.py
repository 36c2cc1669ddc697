"""One training run per workdir: a second one started on it stops in one line.

Two runs in one workdir would save over each other's checkpoints (one of them failing in the
middle of a save) and interleave their metrics. Training holds an exclusive `flock` on
WORKDIR/.lock (which says who holds it) while it runs; the system drops the lock when the
process ends, however it ends. Remote workdirs (gs://, ...) have no such locks: none is taken.
Of a multi-process run, process 0 takes it. A run that creates its workdir and fails before
writing anything in it (a config mistake found while building the task) removes it again.
"""

import contextlib
import fcntl
import os
import socket

import jax

from vit_jax import errors, files

LOCK_FILE = '.lock'


@contextlib.contextmanager
def held(workdir: str):
  """Holds WORKDIR's lock for the duration; ConfigError if another run holds it."""
  if files.is_remote(workdir) or jax.process_index() != 0:
    yield
    return
  created = not os.path.exists(workdir)
  files.makedirs(workdir)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  failed = True
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 200, 0).decode('utf-8', 'replace').strip() or 'another process'
      raise errors.ConfigError(
          f'Another run ({holder}) is training in {workdir}; wait for it to end (or stop it), '
          'or give this run another --workdir.') from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'pid {os.getpid()} on {socket.gethostname()}\n'.encode(), 0)
    yield
    failed = False
  finally:
    if failed and created and os.listdir(workdir) == [LOCK_FILE]:
      os.remove(path)
      os.rmdir(workdir)
    os.close(fd)
