"""Seq2seq training and decoding through the command line (figures present, no timings)."""

import pytest
from benchmark_helpers import peak_rss_bytes, run_benchmark


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
