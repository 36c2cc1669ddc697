"""The benchmark command line, end to end on tiny models (figures present, no timings)."""

import json
import os
import resource
import sys

import jax
import jax.numpy as jnp
import pytest
from helpers import malloc_arenas_after

from vit_jax import benchmark, models
from vit_jax.models import attention
from vit_jax.flops import count_flops

# One layer keeps the compiles short.
TINY_VIT = ['--model', 'ViT-testing', '--num-layers', '1', '--resolution', '16', '--batch',
            '2', '--steps', '2', '--warmup', '1']


def _run(tmp_path, capsys, *argv):
  path = tmp_path / 'out.json'
  assert benchmark.main([*argv, '--json', str(path)]) == 0
  printed = capsys.readouterr().out
  return json.loads(path.read_text()), printed


def _forward_macs(batch=2, dtype=jnp.float32):
  # The dtype picks the attention kernel (cuDNN pads odd lengths on GPUs: more work).
  model = models.get_model('ViT-testing', num_classes=benchmark.NUM_CLASSES, num_layers=1,
                           dtype=dtype)
  images = jax.ShapeDtypeStruct((batch, 16, 16, 3), jnp.float32)
  params = jax.eval_shape(lambda r, x: model.init(r, x)['params'], jax.random.key(0), images)
  return count_flops(lambda p, x: model.apply({'params': p}, x), params, images)


def peak_rss_bytes():
  """This process's peak resident memory, as the OS counts it (Linux: in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
      1 if sys.platform == 'darwin' else 1024)


def test_infer(tmp_path, capsys):
  rss_before = peak_rss_bytes()
  report, printed = _run(tmp_path, capsys, *TINY_VIT, '--mode', 'infer',
                         '--dtype', 'bfloat16', '--peak-tflops', '0.25')
  rss_after = peak_rss_bytes()
  ours = report['ours']
  assert ours['steps_timed'] == 2 and ours['images_per_s'] > 0
  assert ours['step_s_p10'] <= ours['step_s_median'] <= ours['step_s_p90']
  assert ours['images_per_s'] == pytest.approx(2 / ours['step_s_median'])  # --batch 2.
  assert ours['compile_s'] > 0 and ours['macs_per_step'] == _forward_macs(dtype=jnp.bfloat16)
  # Achieved FLOP/s: 2 FLOPs per multiply-add of the step over the median step time; MFU:
  # that over the --peak-tflops given.
  achieved = 2 * ours['macs_per_step'] / ours['step_s_median'] / 1e12
  assert report['peak_tflops'] == 0.25
  assert ours['achieved_tflops'] == pytest.approx(achieved, rel=1e-9)
  assert ours['mfu'] == pytest.approx(achieved / 0.25, rel=1e-9)
  # This process's peak RSS in bytes, read during the run: between the peaks before and after.
  assert rss_before <= ours['memory']['process_peak_rss_bytes'] <= rss_after
  assert ours['memory']['xla_memory_analysis']['argument_size_in_bytes'] > 0
  if ours['memory']['device_peak_bytes'] is not None:  # The step's arguments were on it.
    assert (ours['memory']['device_peak_bytes']
            >= ours['memory']['xla_memory_analysis']['argument_size_in_bytes'])
  assert report['device']['platform'] == jax.devices()[0].platform
  assert 'images/s' in printed and 'ours (jax)' in printed and 'bfloat16' in printed
  kernel = attention.resolve_attention_impl('auto', dtype=jnp.bfloat16)
  assert f'attention auto ({kernel})' in printed
  # On CPUs glibc keeps freed memory by default, as the trainer does.
  assert ('tuned malloc' in printed) == (jax.default_backend() == 'cpu')


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc')
@pytest.mark.parametrize('flags, tuned', [((), True), (('--no-tune-malloc',), False)])
def test_malloc_is_tuned_before_threads_start(flags, tuned):
  # By default on CPUs. Set after JAX's threads first allocate, glibc's arena limit
  # would not hold.
  arenas = malloc_arenas_after('vit_jax.benchmark', *TINY_VIT, *flags,
                               cwd=os.path.dirname(os.path.dirname(__file__)))
  assert arenas == 1 if tuned else arenas > 1


def test_train_counts_the_whole_step(tmp_path, capsys):
  rss_before = peak_rss_bytes()
  report, printed = _run(tmp_path, capsys, *TINY_VIT, '--mode', 'train',
                         '--attention', 'chunked', '--no-tune-malloc', '--peak-tflops', '0.5')
  rss_after = peak_rss_bytes()
  ours = report['ours']
  assert ours['images_per_s'] > 0 and ours['compile_s'] > 0
  # Forward + backward (about 3x the forward's multiply-adds).
  assert 2.5 * _forward_macs() < ours['macs_per_step'] < 3.5 * _forward_macs()
  # Achieved FLOP/s and MFU of the whole train step, from its median step time.
  achieved = 2 * ours['macs_per_step'] / ours['step_s_median'] / 1e12
  assert ours['achieved_tflops'] == pytest.approx(achieved, rel=1e-9)
  assert ours['mfu'] == pytest.approx(achieved / 0.5, rel=1e-9)
  assert rss_before <= ours['memory']['process_peak_rss_bytes'] <= rss_after
  assert 'tuned malloc' not in printed
  assert 'train' in printed and 'chunked' in printed


def test_seq2seq(tmp_path, capsys):
  rss_before = peak_rss_bytes()
  report, printed = _run(tmp_path, capsys, '--model', 'Transformer-testing', '--mode',
                         'seq2seq', '--num-layers', '1', '--batch', '2', '--seq-len', '6',
                         '--decode-length', '5', '--vocab-size', '17', '--steps', '2',
                         '--warmup', '1', '--peak-tflops', '0.5')
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


def test_attention_memory(tmp_path, capsys):
  report, printed = _run(tmp_path, capsys, '--attention-memory', '--model', 'ViT-testing',
                         '--resolutions', '16,128', '--memory-impls', 'plain,chunked')
  assert report['method'].startswith('XLA compiled memory_analysis')
  small, large = report['rows']
  assert (small['tokens'], large['tokens']) == (17, 1025)
  # 1025 tokens: the chunked path never holds the (T, S) scores.
  assert large['chunked']['temp_size_in_bytes'] < large['plain']['temp_size_in_bytes']
  assert 'chunked temp MiB' in printed


def test_compile_depth(tmp_path, capsys):
  report, printed = _run(tmp_path, capsys, '--compile-depth', '--depth-model', 'ViT-testing',
                         '--resolution', '16', '--batch', '1', '--compile-repeats', '1',
                         '--no-unrolled')
  assert report['shallow_scan']['num_layers'] == 4
  assert report['deep_scan']['compile_s'] > 0 and report['deep_scan_over_shallow_scan'] > 0
  assert 'target < 2x' in printed


def test_compare_timm_without_torch_is_a_clear_error(capsys):
  try:
    benchmark.import_timm(None)
    pytest.skip('torch and timm are installed here')
  except ImportError:
    pass
  assert benchmark.main([*TINY_VIT, '--compare', 'timm']) == 1
  assert '--compare timm needs torch and timm' in capsys.readouterr().err


def test_bad_arguments_are_rejected():
  with pytest.raises(SystemExit):
    benchmark.parse_args(['--steps', '0'])
  with pytest.raises(SystemExit):
    benchmark.parse_args(['--attention', 'magic'])


def test_xla_options_are_typed_and_checked():
  assert benchmark.parse_xla_options(
      ['xla_cpu_enable_fast_math=false', 'xla_cpu_parallel_codegen_split_count=4',
       'xla_cpu_experimental_ynn_fusion_type=']) == {
           'xla_cpu_enable_fast_math': False, 'xla_cpu_parallel_codegen_split_count': 4,
           'xla_cpu_experimental_ynn_fusion_type': ''}
  with pytest.raises(SystemExit):
    benchmark.parse_args(['--xla-option', 'no_equals_sign'])


def test_xla_options_reach_the_compiler(tmp_path, capsys):
  _, printed = _run(tmp_path, capsys, *TINY_VIT, '--xla-option', 'xla_cpu_enable_fast_math=false')
  assert 'XLA xla_cpu_enable_fast_math=false' in printed
  # An option XLA does not know fails the compile, with the option named.
  assert benchmark.main([*TINY_VIT, '--xla-option', 'xla_no_such_option=1']) == 1
  assert 'xla_no_such_option' in capsys.readouterr().err
