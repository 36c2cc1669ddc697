"""The command line: start-up (malloc tuning), flags and XLA options."""

import os
import sys

import pytest
from benchmark_helpers import TINY_VIT, run_benchmark
from helpers import process_after

from vit_jax.benchmark import cli


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc')
@pytest.mark.parametrize('flags, tuned', [((), True), (('--no-tune-malloc',), False)])
def test_malloc_is_tuned_before_threads_start(flags, tuned):
  # By default on CPUs. Set after JAX's threads first allocate, glibc's arena limit
  # would not hold.
  report = process_after('vit_jax.benchmark', *TINY_VIT, *flags,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
  assert report.arenas == 1 if tuned else report.arenas > 1


def test_bad_arguments_are_rejected():
  with pytest.raises(SystemExit):
    cli.parse_args(['--steps', '0'])
  with pytest.raises(SystemExit):
    cli.parse_args(['--attention', 'magic'])


def test_xla_options_are_typed_and_checked():
  assert cli.parse_xla_options(
      ['xla_cpu_enable_fast_math=false', 'xla_cpu_parallel_codegen_split_count=4',
       'xla_cpu_experimental_ynn_fusion_type=']) == {
           'xla_cpu_enable_fast_math': False, 'xla_cpu_parallel_codegen_split_count': 4,
           'xla_cpu_experimental_ynn_fusion_type': ''}
  with pytest.raises(SystemExit):
    cli.parse_args(['--xla-option', 'no_equals_sign'])


def test_xla_options_reach_the_compiler(tmp_path, capsys):
  _, printed = run_benchmark(
      tmp_path, capsys, *TINY_VIT, '--xla-option', 'xla_cpu_enable_fast_math=false')
  assert 'XLA xla_cpu_enable_fast_math=false' in printed
  # An option XLA does not know fails the compile, with the option named.
  assert cli.main([*TINY_VIT, '--xla-option', 'xla_no_such_option=1']) == 1
  assert 'xla_no_such_option' in capsys.readouterr().err
