"""Shared helpers of the benchmark's tests: tiny flags, a run read back from its JSON."""

import json
import resource
import sys

from vit_jax.benchmark import cli

# One layer keeps the compiles short.
TINY_VIT = ['--model', 'ViT-testing', '--num-layers', '1', '--resolution', '16', '--batch',
            '2', '--steps', '2', '--warmup', '1']


def run_benchmark(tmp_path, capsys, *argv):
  """Runs the command line with `argv`; returns (its JSON figures, what it printed)."""
  path = tmp_path / 'out.json'
  assert cli.main([*argv, '--json', str(path)]) == 0
  printed = capsys.readouterr().out
  return json.loads(path.read_text()), printed


def peak_rss_bytes():
  """This process's peak resident memory, as the OS counts it (Linux: in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
      1 if sys.platform == 'darwin' else 1024)
