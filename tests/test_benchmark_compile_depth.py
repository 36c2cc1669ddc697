"""--compile-depth through the command line."""

from benchmark_helpers import run_benchmark


def test_compile_depth(tmp_path, capsys):
  report, printed = run_benchmark(
      tmp_path, capsys, '--compile-depth', '--depth-model', 'ViT-testing', '--resolution', '16',
      '--batch', '1', '--compile-repeats', '1', '--no-unrolled')
  assert report['shallow_scan']['num_layers'] == 4
  assert report['deep_scan']['compile_s'] > 0 and report['deep_scan_over_shallow_scan'] > 0
  assert 'target < 2x' in printed
