"""The default `--config`: the config an earlier run saved in WORKDIR/config.json.

So `python -m vit_jax.main --workdir=W --config.trainer=evaluate` evaluates the run in W
with nothing else on the command line (and `--config.FIELD=VALUE` still overrides).
"""

import sys

import ml_collections

from vit_jax import files
from vit_jax.train import flag_errors, run_config


def get_config() -> ml_collections.ConfigDict:
  """WORKDIR/config.json, or an empty config (task '') that main rejects with a hint."""
  workdir = flag_errors.flag_value(sys.argv, 'workdir')
  if workdir is None or not files.exists(run_config.config_path(workdir)):
    return ml_collections.ConfigDict({'task': '', 'trainer': ''})
  return run_config.load_config(workdir)
