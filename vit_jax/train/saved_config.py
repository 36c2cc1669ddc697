"""The default `--config`: the config an earlier run saved in WORKDIR/config.json.

So `python -m vit_jax.main --workdir=W --config.trainer=evaluate` evaluates the run in W
with nothing else on the command line (and `--config.FIELD=VALUE` still overrides).
"""

import os
import sys

import ml_collections

from vit_jax.train import checkpointing


def _workdir_from_argv(argv: list[str]) -> str | None:
  for i, arg in enumerate(argv):
    if arg.startswith('--workdir='):
      return arg.split('=', 1)[1]
    if arg == '--workdir' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def get_config() -> ml_collections.ConfigDict:
  """WORKDIR/config.json, or an empty config (task '') that main rejects with a hint."""
  workdir = _workdir_from_argv(sys.argv)
  if workdir is None or not os.path.exists(checkpointing.config_path(workdir)):
    return ml_collections.ConfigDict({'task': '', 'trainer': ''})
  return checkpointing.load_config(workdir)
