"""The process-wide settings of a program (vit_jax.runtime)."""

import os
import re
import subprocess
import sys

import jax
import ml_collections
import pytest
from helpers import REPO, digits_command, final_eval

from vit_jax import errors, main, runtime

# A program that sets the collector as the command-line programs do, then leaves garbage
# in a reference cycle with a finalizer at exit.
_PROGRAM = """
import gc
from vit_jax import runtime
runtime.collect_garbage_sparingly()

class Noisy:
  def __init__(self, name):
    self.name, self.me = name, self
  def __del__(self):
    print('finalized', self.name, flush=True)

Noisy('garbage')
print('threshold', gc.get_threshold()[2], flush=True)
"""


def test_garbage_left_at_exit_is_still_finalized():
  """collect_garbage_sparingly collects once at exit, before it freezes what is left: the
  finalizers of unreachable cycles run, as Python's own finalization would run them."""
  out = subprocess.run([sys.executable, '-c', _PROGRAM], capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0] == f'threshold {runtime.PROGRAM_FULL_COLLECTION_THRESHOLD}'
  assert 'finalized garbage' in lines[1:]


def test_auto_compilation_cache_is_the_environments_else_the_users_on_accelerators(
    monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  assert runtime.compilation_cache_dir('auto', on_cpu=False) == str(tmp_path / 'xdg/vit_jax/xla')
  assert runtime.compilation_cache_dir('auto', on_cpu=True) is None
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path / 'env'))
  for on_cpu in (True, False):
    assert runtime.compilation_cache_dir('auto', on_cpu) == str(tmp_path / 'env')
    assert runtime.compilation_cache_dir('off', on_cpu) is None
    assert runtime.compilation_cache_dir(str(tmp_path / 'mine'), on_cpu) == str(tmp_path / 'mine')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  assert runtime.compilation_cache_dir('~/xla', True) == str(tmp_path / 'home/xla')
  with pytest.raises(errors.ConfigError, match="compilation_cache is empty: name a directory"):
    runtime.compilation_cache_dir('', True)


def test_off_turns_the_environments_cache_off(monkeypatch, tmp_path):
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path))
  saved = jax.config.jax_compilation_cache_dir
  try:
    assert runtime.use_compilation_cache('off', on_cpu=True) is None
    assert jax.config.jax_compilation_cache_dir is None
  finally:
    jax.config.update('jax_compilation_cache_dir', saved)


def test_a_second_start_reads_the_programs_the_first_compiled(tmp_path):
  """`--config.compilation_cache=DIR`: the train step compiled by one run is read by the next."""
  cache = tmp_path / 'cache'
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  env['JAX_LOG_COMPILES'] = '1'  # JAX then says which programs it read from the cache.
  hits = []
  for run in ('first', 'second'):
    out = subprocess.run(
        digits_command(tmp_path / run, 2, '--config.model.num_layers=1',
                       f'--config.compilation_cache={cache}'),
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    hits.append(re.findall(r"Persistent compilation cache hit for '(\w+)'", out.stderr))
    assert list(cache.glob('jit_train_step-*'))
  assert 'jit_train_step' not in hits[0], hits
  if 'jit_train_step' not in hits[1] and "doesn't match the machine type" in out.stderr:
    pytest.skip('XLA:CPU rejects the programs it cached on this CPU (jax-ml/jax#38445), which '
                "is why 'auto' keeps no cache on CPUs; the first run wrote its programs to DIR.")
  assert 'jit_train_step' in hits[1], (hits, out.stderr)


def test_an_unusable_compilation_cache_costs_a_warning_not_the_run(tmp_path):
  (tmp_path / 'a_file').write_text('')
  out = subprocess.run(digits_command(tmp_path / 'run', 2, '--config.model.num_layers=1',
                                      f'--config.compilation_cache={tmp_path}/a_file/xla'),
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode == 0, out.stderr
  assert 'persistent compilation cache' in out.stderr
  assert final_eval(out, 2)


def test_tune_malloc_without_glibc_is_a_note_and_the_run_goes_on(monkeypatch, capsys):
  monkeypatch.setattr(runtime, 'tune_malloc', lambda: False)  # As on macOS.
  main.tune_malloc_for(ml_collections.ConfigDict({'tune_malloc': True}), on_cpu=True)
  assert capsys.readouterr().err == ('note: config.tune_malloc needs glibc (Linux); running '
                                     'without it (set it to False to leave this note out).\n')
  main.tune_malloc_for(ml_collections.ConfigDict({'tune_malloc': True}), on_cpu=False)
  assert capsys.readouterr().err == ''  # Accelerator runs leave malloc alone.
