"""Shared test helpers."""

import json
import os


def override(config, overrides: dict):
  """Sets `config[a][b] = value` for each 'a.b' key in `overrides`; returns `config`."""
  for key, value in overrides.items():
    target = config
    *parents, leaf = key.split('.')
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config


def read_metrics(workdir, split):
  """The rows of WORKDIR/metrics.jsonl for `split` ('train' or 'test')."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [row for row in map(json.loads, f) if row['split'] == split]
