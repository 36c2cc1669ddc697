"""Seq2seq training and decoding through the command line (figures present, no timings)."""

import pytest
from benchmark_helpers import peak_rss_bytes, run_benchmark

from vit_jax.benchmark import cli


def test_seq2seq(tmp_path, capsys):
  rss_before = peak_rss_bytes()
  report, printed = run_benchmark(
      tmp_path, capsys, '--model', 'Transformer-testing', '--mode', 'seq2seq', '--num-layers', '1',
      '--batch', '2', '--seq-len', '6', '--decode-length', '5', '--vocab-size', '17',
      '--steps', '2', '--warmup', '1', '--peak-tflops', '0.5')
  rss_after = peak_rss_bytes()
  for name in ('train', 'decode_cached', 'decode_uncached'):
    assert report[name]['tokens_per_s'] > 0 and report[name]['macs_per_step'] > 0
    achieved = 2 * report[name]['macs_per_step'] / report[name]['step_s_median'] / 1e12
    assert report[name]['achieved_tflops'] == pytest.approx(achieved, rel=1e-9)
  # MFU of the train step only, over the --peak-tflops given.
  assert report['train']['mfu'] == pytest.approx(report['train']['achieved_tflops'] / 0.5)
  assert rss_before <= report['memory']['process_peak_rss_bytes'] <= rss_after
  # Re-running the decoder on the whole prefix costs more than the cached step.
  assert report['decode_uncached']['macs_per_step'] > report['decode_cached']['macs_per_step']
  assert report['cached_over_uncached_decode_speed'] > 0
  assert report['greedy_tokens_agree_cached_vs_uncached'] == 1.0
  assert 'cached / uncached' in printed


TINY_SEQ2SEQ = ['--model', 'Transformer-testing', '--mode', 'seq2seq', '--num-layers', '1',
                '--batch', '2', '--seq-len', '6', '--decode-length', '5', '--vocab-size', '17',
                '--steps', '2', '--warmup', '1']


def test_seq2seq_against_torch(tmp_path, capsys):
  """torch.nn.Transformer of the same shape, timed beside ours, and the ratio printed."""
  pytest.importorskip('torch')
  report, printed = run_benchmark(tmp_path, capsys, *TINY_SEQ2SEQ, '--compare', 'torch',
                                  '--embed-dim', '16', '--num-heads', '2', '--mlp-dim', '24')
  assert report['torch_train']['tokens_per_s'] > 0
  assert report['ours_over_torch_train_tokens_per_s'] == pytest.approx(
      report['train']['tokens_per_s'] / report['torch_train']['tokens_per_s'])
  assert 'torch train' in printed and 'ours/torch train tokens/s:' in printed
  assert report['args']['embed_dim'] == 16


def test_a_peer_of_another_mode_is_a_flag_error(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.parse_args([*TINY_SEQ2SEQ, '--compare', 'timm'])
  assert exit_info.value.code == 2
  assert '--compare timm does not apply to --mode seq2seq; use --compare torch' in (
      capsys.readouterr().err)
