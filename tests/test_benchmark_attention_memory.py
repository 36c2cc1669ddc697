"""--attention-memory through the command line."""

from benchmark_helpers import run_benchmark


def test_attention_memory(tmp_path, capsys):
  report, printed = run_benchmark(
      tmp_path, capsys, '--attention-memory', '--model', 'ViT-testing', '--resolutions', '16,128',
      '--memory-impls', 'plain,chunked')
  assert report['method'].startswith('XLA compiled memory_analysis')
  small, large = report['rows']
  assert (small['tokens'], large['tokens']) == (17, 1025)
  # 1025 tokens: the chunked path never holds the (T, S) scores.
  assert large['chunked']['temp_size_in_bytes'] < large['plain']['temp_size_in_bytes']
  assert 'chunked temp MiB' in printed
