"""Seq2seq training and decoding through the command line (figures present, no timings)."""

import sys

import pytest
from benchmark_helpers import peak_rss_bytes, run_benchmark

from vit_jax.benchmark import cli, seq2seq


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


def test_compare_torch_without_torch_fails_before_building_anything(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, 'torch', None)  # `import torch` raises, as where it is not.
  built = []
  monkeypatch.setattr(seq2seq.models, 'get_model', lambda *a, **k: built.append(a))
  assert cli.main([*TINY_SEQ2SEQ, '--compare', 'torch']) == 1
  assert not built
  err = capsys.readouterr().err
  assert '--compare torch needs torch' in err and 'pip install torch' in err


def test_a_peer_of_another_mode_is_a_flag_error(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.parse_args([*TINY_SEQ2SEQ, '--compare', 'timm'])
  assert exit_info.value.code == 2
  assert '--compare timm does not apply to --mode seq2seq; use --compare torch' in (
      capsys.readouterr().err)


def test_packed_rows_are_the_trainers_and_the_peer_gets_as_many_tokens():
  import numpy as np  # pylint: disable=g-import-not-at-top
  from vit_jax.benchmark import seq2seq  # pylint: disable=g-import-not-at-top
  packed, padded = seq2seq.packed_pairs(np.random.default_rng(0), 8, 32, 100, 6)
  assert packed['targets'].shape == (8, 32) and packed['targets_segmentation'].max() > 2
  # Every packed example ends with EOS, and segments number the examples of each row.
  ends = (packed['targets'] == 1).sum()
  assert ends == sum(len(set(row[row > 0])) for row in packed['targets_segmentation'])
  ours, theirs = (packed['targets'] > 0).sum(), (padded['targets'] > 0).sum()
  assert abs(int(theirs) - int(ours)) <= padded['targets'].shape[1]
  assert (padded['targets'] > 0).mean() > 0.6  # Pairs of similar length: little padding.


def test_profile_times_the_parts_of_a_packed_step(tmp_path, capsys):
  report, printed = run_benchmark(tmp_path, capsys, *TINY_SEQ2SEQ[:-4], '--seq-len', '16',
                                  '--packed', '--sentence-length', '4', '--profile',
                                  '--steps', '2', '--warmup', '1')
  parts = report['parts']
  assert parts['train step']['share_of_step'] == 1.0
  assert {'train step without dropout', 'optimizer update', 'projection + loss, fwd + bwd',
          'host batching'} <= set(parts)
  assert all(part['ms'] > 0 for part in parts.values())
  assert 'attention x3 (' in printed and 'of the step' in printed


def test_profile_is_for_seq2seq_alone(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(['--mode', 'train', '--profile'])
  assert '--profile applies to --mode seq2seq' in capsys.readouterr().err
