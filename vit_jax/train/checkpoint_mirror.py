"""A local copy of a remote checkpoint directory, for filesystems orbax cannot write."""

import os
import re
import shutil
import tempfile
import weakref

import jax

from vit_jax import errors, files
STEP = re.compile(r'\d+')  # The name of a step's directory.
UPLOADED = '.uploaded-{step}'  # Beside an uploaded step directory: it is complete.


class Mirror:
  """A local copy of a remote checkpoint directory, for filesystems orbax cannot write.

  Holds the remote's uploaded steps; `sync` uploads the steps orbax has completed since
  and removes the remote steps orbax has deleted. One process only. The local copy is
  removed by `close`, or else when the Mirror is collected or the process exits (a run that
  failed after reading the checkpoints).
  """

  def __init__(self, remote: str):
    if jax.process_count() > 1:
      raise errors.ConfigError(
          f'Checkpoints in {remote} go through a local copy, which serves one process; with '
          f'{jax.process_count()} processes put the workdir on a shared local path or gs://.')
    self.remote = remote
    self.local = tempfile.mkdtemp(prefix='vit_jax_checkpoints_')
    self._remove_local = weakref.finalize(self, shutil.rmtree, self.local, ignore_errors=True)
    for step in self._remote_steps():
      files.copy_tree(files.join(remote, str(step)), os.path.join(self.local, str(step)))

  def _remote_steps(self) -> list[int]:
    if not files.isdir(self.remote):
      return []
    names = set(files.listdir(self.remote))
    return [int(n) for n in names if STEP.fullmatch(n) and UPLOADED.format(step=n) in names]

  def sync(self):
    local = {int(n) for n in os.listdir(self.local) if STEP.fullmatch(n)}
    remote = set(self._remote_steps())
    files.makedirs(self.remote)
    for step in sorted(local - remote):
      target = files.join(self.remote, str(step))
      files.remove_tree(target)  # A partial upload of a run that died.
      files.copy_tree(os.path.join(self.local, str(step)), target)
      files.write_bytes_atomically(files.join(self.remote, UPLOADED.format(step=step)), b'')
    for step in sorted(remote - local):
      files.remove_tree(files.join(self.remote, UPLOADED.format(step=step)))
      files.remove_tree(files.join(self.remote, str(step)))

  def close(self):
    self._remove_local()
