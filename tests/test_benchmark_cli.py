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


def _usage_error(capsys, argv) -> str:
  with pytest.raises(SystemExit):
    cli.parse_args(argv)
  return capsys.readouterr().err.splitlines()[-1]


def test_out_of_range_flags_are_one_line_naming_each_before_anything_runs(capsys):
  assert _usage_error(capsys, ['--rounds', '0', '--resolution', '0', '--warmup', '-2',
                               '--peak-tflops', '-1', '--num-layers', '0']) == (
      'python -m vit_jax.benchmark: error: invalid --warmup -2 (expected an integer >= 0), '
      '--rounds 0 (expected an integer >= 1), --resolution 0 (expected an integer >= 1), '
      '--num-layers 0 (expected an integer >= 1), --peak-tflops -1 (expected a number > 0)')
  assert _usage_error(capsys, ['--attention-memory', '--resolutions', '32,abc']).endswith(
      "argument --resolutions: '32,abc' is not comma-separated integers, e.g. 256,512")


def test_the_model_must_be_of_the_kind_the_mode_times(capsys):
  assert cli.parse_args(['--mode', 'seq2seq']).model == 'Transformer-base'
  assert cli.parse_args(['--mode', 'train']).model == 'ViT-B_16'
  assert _usage_error(capsys, ['--model', 'Transformer-base']).endswith(
      'error: --mode infer times an image model, but --model Transformer-base is not one: '
      'choose one of ViT-Ti_16, ViT-S_16, ViT-S_32, ViT-B_16, ViT-B_32, ViT-L_16, ViT-L_32, '
      'ViT-H_14, ViT-testing, R50+ViT-B_16, R26+ViT-S_32, R+ViT-Ti_16, R+ViT-testing, DeiT-Ti_16, '
      'DeiT-S_16, DeiT-B_16, DeiT-testing (or --mode seq2seq for it).')
  assert _usage_error(capsys, ['--mode', 'seq2seq', '--model', 'ViT-testing']).endswith(
      'error: --mode seq2seq times a seq2seq Transformer, but --model ViT-testing is not one: '
      'choose one of Transformer-base, Transformer-big, Transformer-testing.')
  assert _usage_error(capsys, ['--model', 'ViT-testing', '--embed-dim', '16']).endswith(
      'error: --embed-dim shape(s) the seq2seq Transformer (--mode seq2seq); --model ViT-testing '
      'takes its own widths.')


def test_an_output_that_cannot_be_written_is_said_before_the_run(tmp_path, capsys):
  (tmp_path / 'a_file').write_text('')
  for flag in ('--json', '--hlo-out'):
    assert _usage_error(capsys, [*TINY_VIT, flag, str(tmp_path / 'a_file' / 'out')]).endswith(
        f'error: Cannot write {tmp_path / "a_file" / "out"}: Not a directory '
        f'({tmp_path / "a_file"}); '
        'choose a path in a directory you can write to.')
  assert _usage_error(capsys, [*TINY_VIT, '--json', str(tmp_path)]).endswith(
      f'error: Cannot write {tmp_path}: Is a directory; choose a path in a directory you can '
      'write to.')


def test_help_shows_defaults_that_are_values(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(['--help'])
  printed = capsys.readouterr().out
  assert '(default: 20)' in printed  # --steps.
  assert '(default: None)' not in printed
