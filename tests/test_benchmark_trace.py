"""--trace (where a step's time goes), beam-search decoding, and --optimizer-state-dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmark_helpers import run_benchmark

from vit_jax import decode, models
from vit_jax.benchmark import cli, hlo_costs, steps, trace
from vit_jax.kernels import blas
from test_benchmark_seq2seq import TINY_SEQ2SEQ


def _span(name, pid, tid, ts, dur, **args):
  return {'ph': 'X', 'name': name, 'pid': pid, 'tid': tid, 'ts': ts, 'dur': dur, 'args': args}


def test_summary_uses_the_gpu_kernels_and_counts_self_time():
  meta = [{'ph': 'M', 'name': 'process_name', 'pid': 1, 'args': {'name': '/device:GPU:0'}},
          {'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': 7, 'args': {'name': 'Stream #13'}},
          {'ph': 'M', 'name': 'process_name', 'pid': 2, 'args': {'name': '/host:CPU'}}]
  events = meta + [
      _span('nvjet_hsh_128x256_gemm', 1, 7, 0, 600),
      _span('cudnn_generated_fort_native_sdpa_sm90', 1, 7, 600, 300),
      _span('loop_add_fusion', 1, 7, 900, 100),
      # The patch embedding's convolution on cuDNN (a kernel name seen on an H200).
      _span('sm80_xmma_fprop_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_'
            'tilesize256x64x32_stage3_warpsize4x1x1_g1_tensor16x8x16_execute_kernel__5x_cudnn',
            1, 7, 1000, 200),
      _span('fusion.3', 2, 1, 0, 5000, hlo_op='fusion.3'),  # Host side: left out.
  ]
  summary = trace.summarise({'traceEvents': events}, steps=2)
  assert summary['source'] == trace.DEVICE_SOURCE and summary['events'] == 4
  assert summary['op_ms_per_step'] == pytest.approx(0.6)
  shares = {row['name']: row['share'] for row in summary['categories']}
  assert shares == pytest.approx({'matmul': 8 / 12, 'attention': 3 / 12,
                                  'fusion (elementwise/reduce)': 1 / 12})
  # Without device tracks, the host's XLA ops; a while loop counts less its body.
  host = [_span('while.1', 2, 1, 0, 1000, hlo_op='while.1'),
          _span('dot.2', 2, 1, 100, 700, hlo_op='dot.2'),
          _span('PjRt::Execute', 2, 1, 0, 2000)]
  summary = trace.summarise({'traceEvents': host}, steps=1)
  assert summary['source'] == trace.HOST_SOURCE
  assert {r['name']: r['ms_per_step'] for r in summary['top_ops']} == pytest.approx(
      {'dot.2': 0.7, 'while.1': 0.3})


def test_host_ops_that_call_a_library_are_named_and_counted_by_their_target():
  # On CPUs our products and attention on the BLAS are FFI calls: 'other' without the HLO.
  hlo = (
      '  %ffi_call.3 = f32[4,8]{1,0} custom-call(%a, %b), custom_call_target="vit_jax_gemm_bf16",'
      ' operand_layout_constraints={bf16[4,2]{1,0}, bf16[2,8]{1,0}}, api_version=API_VERSION_'
      'TYPED_FFI, metadata={op_name="jit(f)/Dense_0/ffi_call"}\n'
      '  ROOT %ffi_call.4 = f32[1,4,2,4]{3,2,1,0} custom-call(%q, %k, %v), custom_call_target='
      '"vit_jax_attention_f32", api_version=API_VERSION_TYPED_FFI\n'
      '  %add_fusion.2 = f32[4,8]{1,0} fusion(%ffi_call.3), kind=kLoop, calls=%fused_computation\n')
  host = [_span('ffi_call.3', 2, 1, 0, 600, hlo_op='ffi_call.3'),
          _span('ffi_call.4', 2, 1, 600, 300, hlo_op='ffi_call.4'),
          _span('add_fusion.2', 2, 1, 900, 50, hlo_op='add_fusion.2'),
          _span('wrapped_convert.5', 2, 1, 950, 50, hlo_op='wrapped_convert.5')]
  assert hlo_costs.custom_call_targets(hlo) == {'ffi_call.3': 'vit_jax_gemm_bf16',
                                               'ffi_call.4': 'vit_jax_attention_f32'}
  summary = trace.summarise({'traceEvents': host}, steps=1, hlo_text=hlo)
  assert {r['name']: r['category'] for r in summary['top_ops']} == {
      'ffi_call.3 (vit_jax_gemm_bf16)': 'matmul', 'ffi_call.4 (vit_jax_attention_f32)': 'attention',
      'add_fusion.2': 'fusion (elementwise/reduce)',
      'wrapped_convert.5': 'fusion (elementwise/reduce)'}
  assert {r['name']: r['share'] for r in summary['categories']} == pytest.approx(
      {'matmul': 0.6, 'attention': 0.3, 'fusion (elementwise/reduce)': 0.1})
  without_hlo = trace.summarise({'traceEvents': host}, steps=1)
  assert {r['name'] for r in without_hlo['categories']} == {'other',
                                                            'fusion (elementwise/reduce)'}


def test_every_cpu_kernel_target_has_its_category():
  targets = {blas.GEMM_TARGET: 'matmul', blas.GEMM_BF16_TARGET: 'matmul',
             blas.DENSE_BF16_TARGET: 'matmul',
             **{target: 'matmul' for target in blas.CONV_TARGETS},
             blas.GROUP_NORM_TARGET: 'normalization', blas.GROUP_NORM_BF16_TARGET: 'normalization',
             **{target: 'attention' for target in blas.ATTENTION_TARGETS}}
  assert {t: trace.category(f'ffi_call.7 ({t})') for t in targets} == targets


def test_trace_of_a_real_train_step_adds_up(tmp_path, capsys):
  report, printed = run_benchmark(
      tmp_path, capsys, '--model', 'ViT-testing', '--mode', 'train', '--batch', '2',
      '--resolution', '16', '--steps', '2', '--warmup', '1', '--rounds', '1',
      '--trace', str(tmp_path / 'trace'), '--trace-steps', '2')
  summary = report['trace']
  assert summary['steps'] == 2 and summary['op_ms_per_step'] > 0
  assert sum(row['share'] for row in summary['categories']) == pytest.approx(1.0)
  assert 'matmul' in {row['name'] for row in summary['categories']} or any(
      'fusion' in row['name'] for row in summary['categories'])
  assert f'trace of 2 steps, from the {summary["source"]}' in printed
  assert 'of op time' in printed


def test_trace_does_not_combine_with_the_modes_it_cannot_record(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(['--mode', 'seq2seq', '--profile', '--trace', 'x'])
  assert '--trace does not combine with --profile' in capsys.readouterr().err


def test_beam_decoding_is_timed_on_the_translate_modes_search(tmp_path, capsys):
  report, printed = run_benchmark(tmp_path, capsys, *TINY_SEQ2SEQ, '--beam-size', '3')
  beam = report['decode_beam']
  assert beam['tokens_per_s'] > 0 and 'decode_beam' in printed
  # Its tokens are the best hypotheses' of decode.beam_search on the same model and inputs.
  model = models.get_model('Transformer-testing', vocab_size=17, num_layers=1)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(1, 17, (2, 6)).astype(np.int32))
  targets = jnp.asarray(rng.integers(1, 17, (2, 6)).astype(np.int32))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), inputs, targets)['params']
  tokens, _ = decode.beam_search(model, params, inputs, max_length=5, beam_size=3, alpha=0.6)
  counted = int(np.sum(np.asarray(tokens[:, 0]) > 0))
  assert beam['tokens_per_s'] == pytest.approx(counted / beam['step_s_median'])


def test_optimizer_state_dtype_sets_the_first_moment():
  tx, _ = steps.optimizer(10, 'bfloat16')
  state = tx.init({'kernel': jnp.ones((3, 2))})
  moments = [leaf.dtype for leaf in jax.tree.leaves(state) if leaf.shape == (3, 2)]
  assert jnp.bfloat16 in moments and jnp.float32 in moments  # mu bfloat16, nu float32.
  assert 'optimizer state bfloat16' in cli._state_dtype_note(
      cli.parse_args(['--mode', 'train', '--optimizer-state-dtype', 'bfloat16']))
