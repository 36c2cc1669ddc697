"""`python -m vit_jax.benchmark --compile-for h200`: the step compiled for a GPU, on a CPU.

With JAX's CUDA plugin installed (no GPU needed) the command compiles a tiny ViT's train
step for an H200 and the program is the one we expect there: cuDNN's flash attention
forward and backward, the tokens padded once for it (not in every layer) and the padding
hidden by key lengths (cuDNN's padding mask, not a bias to read and differentiate), the MLP's GELU
in the cuBLAS product's epilogue. Without the plugin, the command says what to install.
"""

import json
import os
import re
import subprocess
import sys

import jaxlib
import pytest

from vit_jax.benchmark import gpu_target


PLUGIN = gpu_target.cuda_plugin_installed()
TINY_STEP = ['--mode', 'train', '--model', 'ViT-testing', '--num-layers', '2', '--resolution',
             '16', '--batch', '4', '--dtype', 'bfloat16', '--compile-for', 'h200']


def _benchmark(*argv):
  return subprocess.run([sys.executable, '-m', 'vit_jax.benchmark', *argv], capture_output=True,
                        text=True, timeout=600, env={**os.environ, 'JAX_PLATFORMS': ''},
                        check=False)


@pytest.mark.skipif(not PLUGIN, reason='needs JAX\'s CUDA plugin: pip install '
                    f'jax-cuda12-plugin=={jaxlib.__version__} jax-cuda12-pjrt=={jaxlib.__version__}')
def test_train_step_compiled_for_an_h200(tmp_path):
  hlo_path, json_path = tmp_path / 'step.hlo', tmp_path / 'step.json'
  result = _benchmark(*TINY_STEP, '--hlo-out', str(hlo_path), '--json', str(json_path))
  print(result.stdout)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'compiled for NVIDIA H200 without one (attention auto (cudnn)' in result.stdout
  # Not the plugin's notes that there is no driver, nor absl's preamble to them.
  assert not re.search(r'^I\d{4} |absl::InitializeLog', result.stderr, re.M), result.stderr
  hlo = hlo_path.read_text()
  # Forward and backward of each of the 2 layers on cuDNN's flash kernel, the padding token
  # hidden by key lengths: no bias, so no bias gradient for cuDNN to reduce over the batch.
  assert len(re.findall(r'custom_call_target="__cudnn\$fmhaSoftmax"', hlo)) == 2
  assert len(re.findall(r'custom_call_target="__cudnn\$fmhaSoftmaxBackward"', hlo)) == 2
  assert 'Bias' not in ''.join(re.findall(r'custom_call_target="__cudnn\$fmha\w*"', hlo))
  assert hlo.count('"mask_type": "PADDING"') == 4
  # 17 tokens padded to 18 once, before the layers; q/k/v not padded, nor the output sliced,
  # in each layer's attention.
  assert 'Transformer/jit(_pad)/pad' in hlo
  assert 'MultiHeadDotProductAttention_1/jit(_pad)/pad' not in hlo
  assert 'MultiHeadDotProductAttention_1/slice"' not in hlo
  # The GELU of each layer's MLP computed in its first product's epilogue.
  assert hlo.count('"epilogue":"BIAS_GELU_AUX"') == 2
  report = json.loads(json_path.read_text())
  costs = report['hlo_costs']
  assert {row['name'] for row in costs['categories']} >= {'matmul', 'attention'}
  assert 0 < costs['mfu_bound'] < 1
  assert report['xla_memory_analysis']['temp_size_in_bytes'] > 0


@pytest.mark.skipif(PLUGIN, reason='JAX\'s CUDA plugin is installed here')
def test_without_the_cuda_plugin_the_command_says_what_to_install():
  result = _benchmark(*TINY_STEP)
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: --compile-for needs JAX\'s CUDA plugin')
  assert f'pip install jax-cuda12-plugin=={jaxlib.__version__}' in last


def test_compile_for_rejects_what_does_not_apply(capsys):
  for flags in (['--compare', 'timm'], ['--trace', '/tmp/x'], ['--matmul', 'blas']):
    with pytest.raises(SystemExit):
      from vit_jax.benchmark import cli  # pylint: disable=g-import-not-at-top
      cli.parse_args([*TINY_STEP, *flags])
    assert '--compile-for does not combine with' in capsys.readouterr().err


def test_target_config_describes_the_chip():
  text = gpu_target.TARGETS['h200'].config_text()
  assert 'core_count: 132' in text and 'memory_bandwidth: 4800000000000' in text
  assert 'cuda_compute_capability { major: 9 minor: 0 }' in text
