"""The printed tables of each benchmark, from its figures."""

from typing import Sequence

from vit_jax.benchmark import hlo_costs


def _ms(seconds: float | None) -> str:
  return '-' if seconds is None else f'{seconds * 1e3:.1f}'


def _mb(num_bytes: int | None) -> str:
  if num_bytes is None:
    return '-'
  mib = num_bytes / 2**20
  return f'{mib:,.1f}' if mib < 100 else f'{mib:,.0f}'


def _num(value: float | None, fmt: str) -> str:
  return '-' if value is None else format(value, fmt)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
  line = lambda r: '  '.join(  # noqa: E731
      str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
  return '\n'.join([line(header), line(['-' * w for w in widths])] + [line(r) for r in rows])


def format_vit(report: dict) -> str:
  names = [n for n in ('ours', 'timm') if n in report]
  get = lambda key, fn: [fn(report[n].get(key)) for n in names]  # noqa: E731
  rows = [
      ['compile (s)', _num(report['ours']['compile_s'], '.1f')] + ['-'] * (len(names) - 1),
      ['warm-up (s)'] + get('warmup_s', lambda v: _num(v, '.1f')),
      ['step median (ms)'] + get('step_s_median', _ms),
      ['step p10 / p90 (ms)'] + [f'{_ms(report[n]["step_s_p10"])} / '
                                 f'{_ms(report[n]["step_s_p90"])}' for n in names],
      ['step IQR (ms)'] + get('step_s_iqr', _ms),
      ['images/s'] + get('images_per_s', lambda v: _num(v, '.2f')),
      ['GMACs / step'] + get('macs_per_step', lambda v: _num(v and v / 1e9, '.4g')),
      ['achieved TFLOP/s'] + get('achieved_tflops', lambda v: _num(v, '.3f')),
      ['MFU'] + get('mfu', lambda v: '-' if v is None else f'{100 * v:.1f}%'),
  ]
  for n in names:
    memory = report[n]['memory']
    if memory.get('device_peak_bytes') is not None:
      label = 'peak device memory (MiB)'
      values = {k: _mb(report[k]['memory'].get('device_peak_bytes')) for k in names}
      break
  else:
    label = 'peak process RSS (MiB)'
    values = {k: _mb(report[k]['memory'].get('process_peak_rss_bytes')) for k in names}
  rows.append([label] + [values[n] for n in names])
  analysis = report['ours']['memory'].get('xla_memory_analysis')
  if analysis:
    rows.append(['XLA temp / total (MiB)', f'{_mb(analysis["temp_size_in_bytes"])} / '
                 f'{_mb(analysis["total_bytes"])}'] + ['-'] * (len(names) - 1))
  header = [''] + ['ours (jax)' if n == 'ours' else f'timm ({report[n]["timm_model"]})'
                   for n in names]
  lines = [_table(header, rows)]
  if 'timm' in report:
    lines.append(f'ours/timm images/s: {report["ratio_images_per_s_ours_over_timm"]:.3f} '
                 f'(median steps), {report["ratio_best_step_ours_over_timm"]:.3f} (fastest '
                 'steps)')
    lines.append(f'same weights: max |logit diff| {report["max_abs_logit_diff_vs_timm_f32"]:.1e}'
                 f' (float32); torch threads: {report["timm"]["torch_threads"]}')
  return '\n'.join(lines)


def format_data(report: dict) -> str:
  rows = [[row['variant'], _num(row['per_core'], ',.0f'), _num(row['all_cores'], ',.0f'),
           _num(row['all_cores'] / report['cores'], ',.0f'), _num(row['cores_to_feed'], '.1f')]
          for row in report['rows']]
  header = ['', 'images/s, 1 core', f'images/s, {report["cores"]} cores', 'per core',
            f'cores for {report["feed"]:,.0f}/s']
  resumed = ' / '.join(f'{float(seconds):.2f}' for seconds in report['first_batch_s'].values())
  steps = ' / '.join(f'{int(step):,}' for step in report['first_batch_s'])
  return '\n'.join([_table(header, rows),
                    f'first batch when resuming at step {steps}: {resumed} s'])


def format_seq2seq(report: dict) -> str:
  names = [n for n in ('train', 'decode_cached', 'decode_uncached', 'decode_beam') if n in report]
  rows = [[n, _num(report[n]['compile_s'], '.1f'), _ms(report[n]['step_s_median']),
           f'{_ms(report[n]["step_s_p10"])} / {_ms(report[n]["step_s_p90"])}',
           _num(report[n]['tokens_per_s'], ',.0f'),
           _num(report[n]['macs_per_step'] and report[n]['macs_per_step'] / 1e9, '.4g'),
           _num(report[n]['achieved_tflops'], '.3f')] for n in names]
  header = ['', 'compile (s)', 'step median (ms)', 'p10 / p90 (ms)', 'tokens/s',
            'GMACs/step', 'TFLOP/s']
  if 'torch_train' in report:
    torch_train = report['torch_train']
    rows.insert(1, ['torch train', '-', _ms(torch_train['step_s_median']),
                    f'{_ms(torch_train["step_s_p10"])} / {_ms(torch_train["step_s_p90"])}',
                    _num(torch_train['tokens_per_s'], ',.0f'), '-', '-'])
  mfu = report['train']['mfu']
  ratio = ([f'ours/torch train tokens/s: {report["ours_over_torch_train_tokens_per_s"]:.3f} '
            f'(median steps); torch threads: {report["torch_train"]["torch_threads"]}']
           if 'torch_train' in report else [])
  torch_shape = 'x'.join(map(str, report['torch_train_batch_shape']))
  peer = (f'; torch: {report["torch_train_target_tokens_per_step"]:,} in {torch_shape} padded '
          'rows' if 'torch_train' in report else '')
  return '\n'.join([
      _table(header, rows), *ratio,
      f'train tokens are target tokens, {report["train_target_tokens_per_step"]:,} a step{peer} '
      '(source + target: '
      f'{report["train_source_plus_target_tokens_per_s"]:,.0f}/s); '
      f'train MFU: {"-" if mfu is None else f"{100 * mfu:.1f}%"}',
      f'cached / uncached decoding speed: {report["cached_over_uncached_decode_speed"]:.2f}x'
      f'   (greedy tokens equal: {100 * report["greedy_tokens_agree_cached_vs_uncached"]:.0f}%)',
  ])


def format_seq2seq_profile(report: dict) -> str:
  rows = [[name, f'{part["ms"]:.1f}', f'{100 * part["share_of_step"]:.0f}%']
          for name, part in report['parts'].items()]
  return '\n'.join([
      _table(['part', 'median (ms)', 'of the step'], rows),
      f'{report["train_target_tokens_per_step"]:,} target tokens a step: '
      f'{report["target_tokens_per_s"]:,.0f}/s; parts overlap (see seq2seq_profile).'])


def format_trace(summary: dict) -> str:
  """Where the traced steps' op time goes: by category, and the ops taking the most."""
  share = lambda row: f'{100 * row["share"]:.1f}%'  # noqa: E731
  categories = [[row['name'], f'{row["ms_per_step"]:.3f}', share(row)]
                for row in summary['categories']]
  ops = [[row['name'], row['category'], f'{row["calls_per_step"]:g}', f'{row["ms_per_step"]:.3f}',
          share(row)] for row in summary['top_ops']]
  return '\n'.join([
      f'trace of {summary["steps"]} steps, from the {summary["source"]} ({summary["events"]:,} '
      f'events): {summary["op_ms_per_step"]:.3f} ms of op time a step; {summary["path"]}',
      _table(['category', 'ms / step', 'of op time'], categories), '',
      _table([f'top {len(ops)} ops', 'category', 'calls / step', 'ms / step', 'of op time'],
             ops)])


def format_attention_memory(report: dict, impls: Sequence[str]) -> str:
  header = ['resolution', 'tokens'] + [f'{i} temp MiB' for i in impls] + [
      f'{i} total MiB' for i in impls]
  rows = [[str(r['resolution']), str(r['tokens'])]
          + [_mb(r[i]['temp_size_in_bytes']) for i in impls]
          + [_mb(r[i]['total_bytes']) for i in impls] for r in report['rows']]
  return '\n'.join([_table(header, rows),
                    f'batch 1; {report["method"]}; temp = activations and scratch.'])


def format_compile_depth(report: dict) -> str:
  names = [n for n in ('shallow_scan', 'deep_scan', 'deep_unrolled') if n in report]
  rows = [[n, str(report[n]['num_layers']), str(report[n]['scan_layers']),
           f'{report[n]["lower_s"]:.1f}', f'{report[n]["compile_s"]:.1f}',
           f'{report[n]["total_s"]:.1f}'] for n in names]
  lines = [_table(['', 'layers', 'scan', 'trace+lower (s)', 'XLA compile (s)', 'total (s)'],
                  rows),
           f'{report["model"]} ({report["mode"]}): deep/shallow compile time with scan: '
           f'{report["deep_scan_over_shallow_scan"]:.2f}x (target < 2x)']
  if 'deep_unrolled_over_shallow_scan' in report:
    lines.append(f'unrolled deep / shallow scan: {report["deep_unrolled_over_shallow_scan"]:.2f}x')
  return '\n'.join(lines)


def format_compile_for(report: dict) -> str:
  """What the step compiled for a GPU must move and compute, and its bound."""
  analysis = report['xla_memory_analysis'] or {}
  lines = [hlo_costs.format_summary(report['hlo_costs']),
           f'compile {report["compile_s"]:.1f} s; XLA temp / total '
           f'{_mb(analysis.get("temp_size_in_bytes"))} / {_mb(analysis.get("total_bytes"))} MiB '
           '(the device memory the step needs)']
  return '\n'.join(lines)
