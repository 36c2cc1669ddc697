"""vit_jax.benchmark.hlo_costs: kernels, bytes and FLOPs read off optimised HLO."""

from benchmark_helpers import TINY_VIT, run_benchmark
import jax
import jax.numpy as jnp
import pytest

from vit_jax.benchmark import hlo_costs

# An excerpt of a train step compiled for an H200 (`--compile-for h200`), cut down to the
# attributes that matter: a cuBLAS product with its workspace, an elementwise fusion, cuDNN's
# flash attention forward and backward.
GPU_HLO = """HloModule jit_train_step

%fused_gelu (param_0: bf16[256,3072]) -> bf16[256,3072] {
  %param_0 = bf16[256,3072]{1,0} parameter(0)
  ROOT %tanh.1 = bf16[256,3072]{1,0} tanh(%param_0)
}

ENTRY %main (x: bf16[256,768], w: bf16[768,3072], q: bf16[2,198,12,64]) -> bf16[256,3072] {
  %x = bf16[256,768]{1,0} parameter(0)
  %w = bf16[768,3072]{1,0} parameter(1)
  %q = bf16[2,198,12,64]{3,2,1,0} parameter(2)
  %gemm = (bf16[256,3072]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"DEFAULT"}}
  %product = bf16[256,3072]{1,0} get-tuple-element(%gemm), index=0
  %forward = (bf16[2,12,198,64]{3,1,2,0}, f32[2,12,198]{2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config": {"intermediate_tensor_shape": {"element_type": "BF16", "dimensions": ["2", "12", "198", "198"]}}}
  %backward = (bf16[2,12,198,64]{3,1,2,0}, bf16[2,12,198,64]{3,1,2,0}, bf16[2,12,198,64]{3,1,2,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmaxBackward", backend_config={"cudnn_fmha_backend_config": {"intermediate_tensor_shape": {"element_type": "BF16", "dimensions": ["2", "12", "198", "198"]}}}
  ROOT %gelu = bf16[256,3072]{1,0} fusion(%product), kind=kLoop, calls=%fused_gelu
}
"""


def test_gpu_kernels_bytes_and_flops():
  found = {kernel.name: kernel for kernel in hlo_costs.kernels(GPU_HLO)}
  assert list(found) == ['gemm', 'forward', 'backward', 'gelu']
  gemm = found['gemm']
  # (256, 768) x (768, 3072): 2 FLOPs a multiply-add; the 4 MiB workspace is no data.
  assert gemm.category == 'matmul' and gemm.flops == 2 * 256 * 768 * 3072
  assert gemm.bytes == 2 * (256 * 768 + 768 * 3072 + 256 * 3072)
  qkv = 3 * 2 * 198 * 12 * 64 * 2
  scores = 2 * 12 * 198 * 198
  assert found['forward'].category == 'attention'
  assert found['forward'].flops == 2 * 2 * scores * 64  # q k^T and p v.
  assert found['forward'].bytes == qkv + qkv // 3 + 4 * 2 * 12 * 198
  assert found['backward'].flops == 2 * 5 * scores * 64  # With q k^T recomputed.
  assert found['gelu'].category == 'fusion (elementwise/reduce)'
  assert found['gelu'].flops == 0 and found['gelu'].bytes == 2 * 2 * 256 * 3072


# XLA merges two products that share an input into one; each consumer slices its part.
MERGED_HLO = """HloModule jit_merged

%fused_add (param_0: bf16[64,1024], param_1: bf16[512]) -> bf16[64,8,64] {
  %param_0 = bf16[64,1024]{1,0} parameter(0)
  %slice.1 = bf16[64,512]{1,0} slice(%param_0), slice={[0:64], [0:512]}
  %bitcast.1 = bf16[64,8,64]{2,1,0} bitcast(%slice.1)
  %param_1 = bf16[512]{0} parameter(1)
  %bias = bf16[64,8,64]{2,1,0} bitcast(%param_1)
  ROOT %add.1 = bf16[64,8,64]{2,1,0} add(%bitcast.1, %bias)
}

%fused_tanh (param_0: bf16[64,1024]) -> bf16[64,1024] {
  %param_0 = bf16[64,1024]{1,0} parameter(0)
  %slice.2 = bf16[64,512]{1,0} slice(%param_0), slice={[0:64], [512:1024]}
  ROOT %tanh.2 = bf16[64,1024]{1,0} tanh(%param_0)
}

ENTRY %main (x: bf16[64,1024], b: bf16[512]) -> bf16[64,8,64] {
  %x = bf16[64,1024]{1,0} parameter(0)
  %b = bf16[512]{0} parameter(1)
  %tanh = bf16[64,1024]{1,0} fusion(%x), kind=kLoop, calls=%fused_tanh
  ROOT %sliced = bf16[64,8,64]{2,1,0} fusion(%tanh, %b), kind=kLoop, calls=%fused_add
}
"""


def test_fusion_that_slices_an_operand_reads_the_slice():
  found = {kernel.name: kernel for kernel in hlo_costs.kernels(MERGED_HLO)}
  # Half of the merged product (through a bitcast), the whole bias, the output.
  assert found['sliced'].bytes == 2 * (64 * 512 + 512 + 64 * 512)
  # An operand also read whole counts whole.
  assert found['tanh'].bytes == 2 * 2 * 64 * 1024


def test_summary_bounds_each_kernel_by_its_roofline():
  found = hlo_costs.kernels(GPU_HLO)
  summary = hlo_costs.summarise(found, peak_tflops=1000.0, bandwidth_gbs=4000.0,
                                model_flops=1e9)
  expected = sum(max(k.flops / 1e15, k.bytes / 4e12) for k in found)
  assert summary['bound_s'] == pytest.approx(expected)
  assert summary['kernels'] == 4 and summary['flops'] == sum(k.flops for k in found)
  assert summary['mfu_bound'] == pytest.approx(1e9 / expected / 1e15)
  by_name = {row['name']: row for row in summary['categories']}
  assert by_name['matmul']['kernels'] == 1 and by_name['attention']['kernels'] == 2
  printed = hlo_costs.format_summary(summary)
  print(printed)
  assert 'matmul' in printed and 'cannot exceed' in printed


def test_cpu_program_and_scan_trip_counts():
  """What XLA:CPU compiles reads the same way; a scan's body counts once per trip."""

  def scanned(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=5)[0]

  text = jax.jit(scanned).lower(jnp.ones((64, 32)), jnp.ones((32, 32))).compile().as_text()
  found = hlo_costs.kernels(text)
  products = [k for k in found if k.category == 'matmul']
  assert len(products) == 1 and products[0].calls == 5
  assert products[0].flops == 2 * 64 * 32 * 32
  summary = hlo_costs.summarise(found, 1.0, 1.0)
  assert summary['flops'] == 5 * 2 * 64 * 32 * 32


def test_blas_product_without_dimension_numbers():
  """Our BLAS call (`matmul='blas'` on CPUs) names no contracting dims: K comes from sizes."""
  from vit_jax.kernels import blas  # pylint: disable=g-import-not-at-top
  try:
    blas.load()
  except blas.KernelUnavailable as error:
    pytest.skip(str(error))
  transposed = lambda a, b: blas.matmul(a.T, b)  # noqa: E731  (K x M)^T (K x N)
  for fn, a_shape in ((blas.matmul, (64, 32)), (transposed, (32, 64))):
    text = jax.jit(fn).lower(jnp.ones(a_shape), jnp.ones((32, 16))).compile().as_text()
    products = [k for k in hlo_costs.kernels(text) if k.category == 'matmul']
    assert [k.flops for k in products] == [2 * 64 * 32 * 16]


def test_text_without_entry_is_an_error():
  with pytest.raises(ValueError, match='ENTRY'):
    hlo_costs.kernels('HloModule nothing\n')


def test_hlo_out_of_a_run_reads_back(tmp_path, capsys):
  """`--hlo-out` writes the compiled step; `python -m vit_jax.benchmark.hlo_costs` reads it."""
  path = tmp_path / 'step.hlo'
  run_benchmark(tmp_path, capsys, *TINY_VIT, '--mode', 'infer', '--hlo-out', str(path))
  assert hlo_costs.main([str(path), '--model-tflop', '1e-6']) == 0
  printed = capsys.readouterr().out
  print(printed)
  assert printed.splitlines()[0].startswith('kernels by category')
  assert 'matmul' in printed and 'MFU cannot exceed' in printed
  assert hlo_costs.main([str(tmp_path / 'missing.hlo')]) == 1
  assert 'error: cannot read the kernels of' in capsys.readouterr().err
  for tflop in ('0', '-1'):  # An MFU bound of 0% or -487,685%.
    with pytest.raises(SystemExit):
      hlo_costs.main([str(path), '--model-tflop', tflop])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f'error: invalid --model-tflop {tflop} (expected a number > 0, e.g. 13.459 for a '
        'ViT-B/16 train step at batch 128)')
