"""One table over several benchmark reports and training runs, a row per file.

  python -m vit_jax.benchmark.runs_table runs/b128.json runs/b256.json runs/trainer/metrics.jsonl

Each file is a `--json` report of `python -m vit_jax.benchmark` (`--mode infer`, `train` or
`seq2seq`) or a trainer workdir's `metrics.jsonl`. A report's row gives what ran (mode,
batch, dtype and the options that differ from the defaults), our images/s (tokens/s for
seq2seq, a row per part: train, greedy and beam decoding), MFU, the device's peak memory and
ours over the peer when it ran. A training run's row gives its images/s after the first
progress line (which holds the compilation) and its data-wait share; `--against REPORT`
adds the run's images/s over that report's.
"""

import argparse
import json
import os
from typing import Sequence

from vit_jax import entry, run_metrics
from vit_jax.benchmark import timing

# Benchmark flags shown in a row's "what ran" when they differ from these defaults.
_SHOWN_DEFAULTS = {'attention': 'auto', 'matmul': 'auto', 'scan_layers': False, 'remat': False,
                   'optimizer_state_dtype': 'float32', 'xla_option': [], 'packed': False}


def _label(path: str) -> str:
  """The file's name, or the workdir's for a metrics.jsonl."""
  if os.path.basename(path) == 'metrics.jsonl':
    path = os.path.dirname(os.path.abspath(path))
  return os.path.splitext(os.path.basename(path))[0]


def _options(args: dict, platform: str) -> str:
  shown = []
  for key, default in _SHOWN_DEFAULTS.items():
    value = args.get(key, default)
    if value != default:
      shown.append(' '.join(value) if key == 'xla_option' else
                   key if value is True else f'{key} {value}')
  # How steps were timed, where it is not --timing auto's choice (reports without it, from
  # before the flag, timed isolated steps).
  how = args.get('timing', 'isolated')
  if how != timing.resolve_timing('auto', platform):
    shown.append(f'timing {how}')
  return ', '.join(shown)


def _gib(report_part: dict) -> float | None:
  peak = (report_part.get('memory') or {}).get('device_peak_bytes')
  return None if peak is None else peak / 2**30


def report_rows(path: str, report: dict) -> list[dict]:
  """Rows of one benchmark report."""
  args = report['args']
  what = f'{args["model"]} {args["mode"]} b{args["batch"]} {args["dtype"]}'
  options = _options(args, report.get('device', {}).get('platform', ''))
  what += f' ({options})' if options else ''
  label = _label(path)
  if args['mode'] == 'seq2seq':
    peak = (report.get('memory') or {}).get('device_peak_bytes')
    rows = []
    for part, figures in report.items():
      if isinstance(figures, dict) and 'tokens_per_s' in figures and part != 'torch_train':
        rows.append({'run': f'{label} {part}', 'what': what, 'per_s': figures['tokens_per_s'],
                     'unit': 'tokens/s', 'mfu': figures.get('mfu'),
                     'peak_gib': None if peak is None else peak / 2**30,
                     'vs_peer': report.get('ours_over_torch_train_tokens_per_s')
                     if part == 'train' else None})
    return rows
  ours = report['ours']
  return [{'run': label, 'what': what, 'per_s': ours['images_per_s'], 'unit': 'images/s',
           'mfu': ours.get('mfu'), 'peak_gib': _gib(ours),
           'vs_peer': report.get('ratio_images_per_s_ours_over_timm')}]


def training_row(path: str, lines: list[dict]) -> dict:
  """The row of a trainer's metrics.jsonl: images/s after the first progress line."""
  train = [line for line in lines if line.get('split') == 'train']
  if len(train) < 2:
    raise ValueError(f'{path}: {len(train)} train progress line(s); the images/s after the '
                     'first (which holds the compilation) need two or more: lower '
                     'config.log_every or train longer.')
  steady = train[1:]
  steps = steady[-1]['step'] - train[0]['step']
  # Each line's figures cover the steps since the line before: weight them by those steps.
  spans = [b['step'] - a['step'] for a, b in zip(train, steady)]
  seconds = sum(n / line['examples_per_sec'] for n, line in zip(spans, steady))
  wait = sum(n / line['examples_per_sec'] * line['data_wait_fraction']
             for n, line in zip(spans, steady))
  what = 'trainer'
  config_path = os.path.join(os.path.dirname(os.path.abspath(path)), 'config.json')
  if os.path.exists(config_path):
    with open(config_path) as f:
      config = json.load(f)
    what = f'{config["model"]["name"]} trainer b{config["batch_size"]} {config["model"]["dtype"]}'
  return {'run': _label(path), 'what': f'{what}, steps {train[0]["step"] + 1}-'
          f'{steady[-1]["step"]}, data wait {100 * wait / seconds:.1f}%',
          'per_s': steps / seconds, 'unit': 'ex/s', 'mfu': None, 'peak_gib': None,
          'vs_peer': None, 'data_wait': wait / seconds}


def rows_of(path: str) -> list[dict]:
  with open(path) as f:
    if path.endswith('.jsonl'):  # A trainer killed while writing leaves its last line cut.
      return [training_row(path, run_metrics.parse_rows(f))]
    return report_rows(path, json.load(f))


def format_table(rows: list[dict], against: float | None = None) -> str:
  """The rows as text; `against`: images/s the training runs are divided by."""
  header = ['run', 'what ran', 'per second', 'MFU', 'peak GiB', 'vs peer']
  if against:
    header.append('vs benchmark')
  table = [header]
  for row in rows:
    cells = [row['run'], row['what'], f'{row["per_s"]:,.0f} {row["unit"]}',
             '-' if row['mfu'] is None else f'{100 * row["mfu"]:.1f}%',
             '-' if row['peak_gib'] is None else f'{row["peak_gib"]:.1f}',
             '-' if row['vs_peer'] is None else f'{row["vs_peer"]:.2f}']
    if against:
      cells.append(f'{row["per_s"] / against:.3f}' if row['unit'] == 'ex/s' else '-')
    table.append(cells)
  widths = [max(len(r[i]) for r in table) for i in range(len(header))]
  return '\n'.join('  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m vit_jax.benchmark.runs_table',
                                   description=__doc__.split('\n', 1)[0])
  parser.add_argument('files', nargs='+', help='benchmark --json reports, metrics.jsonl files')
  parser.add_argument('--against', help='a benchmark report: training runs are divided by its '
                      'images/s')
  args = parser.parse_args(argv)
  rows, missing = [], []
  for path in args.files:
    if not os.path.exists(path):
      missing.append(path)
      continue
    try:
      rows.extend(rows_of(path))
    except ValueError as error:
      print(f'error: {error}')
      return 1
    except KeyError as error:
      print(f'error: {path} is neither a benchmark --json report nor a metrics.jsonl (it has '
            f'no {error}).')
      return 1
  against = None
  if args.against:
    against = rows_of(args.against)[0]['per_s']
  print(format_table(rows, against))
  if missing:
    print(f'missing (the run that writes them failed or did not run): {", ".join(missing)}')
  return 0


if __name__ == '__main__':
  entry.run(main)
