"""Image models' infer and train steps through the command line (figures present, no timings)."""

import jax
import jax.numpy as jnp
import pytest
from benchmark_helpers import TINY_VIT, peak_rss_bytes, run_benchmark

from vit_jax import kernels, models
from vit_jax.benchmark import cli, steps, timm_runner
from vit_jax.flops import count_flops
from vit_jax.models import attention


def _forward_macs(batch=2, dtype=jnp.float32):
  # The dtype picks the attention kernel (cuDNN pads odd lengths on GPUs: more work).
  model = models.get_model('ViT-testing', num_classes=steps.NUM_CLASSES, num_layers=1,
                           dtype=dtype)
  images = jax.ShapeDtypeStruct((batch, 16, 16, 3), jnp.float32)
  params = jax.eval_shape(lambda r, x: model.init(r, x)['params'], jax.random.key(0), images)
  return count_flops(lambda p, x: model.apply({'params': p}, x), params, images)


def test_infer(tmp_path, capsys):
  rss_before = peak_rss_bytes()
  report, printed = run_benchmark(
      tmp_path, capsys, *TINY_VIT, '--mode', 'infer', '--dtype', 'bfloat16',
      '--peak-tflops', '0.25')
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
  with kernels.use('auto'):  # Where the benchmark resolves it: 'blas' on CPUs with AMX.
    kernel = attention.resolve_attention_impl('auto', dtype=jnp.bfloat16)
  assert f'attention auto ({kernel})' in printed
  # On CPUs glibc keeps freed memory by default, as the trainer does.
  assert ('tuned malloc' in printed) == (jax.default_backend() == 'cpu')


def test_train_counts_the_whole_step(tmp_path, capsys):
  rss_before = peak_rss_bytes()
  report, printed = run_benchmark(
      tmp_path, capsys, *TINY_VIT, '--mode', 'train', '--attention', 'chunked', '--no-tune-malloc',
      '--peak-tflops', '0.5')
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


def test_compare_timm_without_torch_is_a_clear_error(capsys):
  try:
    timm_runner.import_timm(None)
    pytest.skip('torch and timm are installed here')
  except ImportError:
    pass
  assert cli.main([*TINY_VIT, '--compare', 'timm']) == 1
  assert '--compare timm needs torch and timm' in capsys.readouterr().err
