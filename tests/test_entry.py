"""A program whose output's reader has gone (`python -m vit_jax.models | head -1`) ends quietly
with status 1, one that Ctrl-C interrupts by SIGINT, without a traceback; its own status
otherwise."""

import os
import signal
import subprocess
import sys

import pytest
from helpers import DIGITS_RUN, REPO

from vit_jax import entry


def _with_the_reader_gone(argv, tmp_path) -> tuple[int, str]:
  """(status, stderr) of `python argv`, its stdout a pipe whose reading end is closed before it
  starts, as `head` has left it once it has its lines."""
  read_end, write_end = os.pipe()
  os.close(read_end)
  with open(tmp_path / 'stderr', 'w+', encoding='utf-8') as stderr:
    status = subprocess.run([sys.executable, *argv], stdout=write_end, stderr=stderr,
                            timeout=300, check=False, cwd=REPO).returncode
    os.close(write_end)
    stderr.seek(0)
    return status, stderr.read()


def test_the_model_listing_into_a_closed_pipe_ends_quietly(tmp_path):
  assert _with_the_reader_gone(['-m', 'vit_jax.models'], tmp_path) == (1, '')


def test_a_training_run_into_a_closed_pipe_stops_without_a_traceback(tmp_path):
  command = ['-m', 'vit_jax.main', *DIGITS_RUN, '--config.total_steps=2',
             f'--workdir={tmp_path / "run"}']
  status, stderr = _with_the_reader_gone(command, tmp_path)
  assert (status, stderr) == (1, '')


def test_the_status_is_mains():
  with pytest.raises(SystemExit) as exited:
    entry.run(lambda code: code, 3)
  assert exited.value.code == 3


def test_a_broken_pipe_elsewhere_keeps_its_traceback():
  def main():
    raise BrokenPipeError(32, 'a socket')

  with pytest.raises(BrokenPipeError, match='a socket'):
    entry.run(main)


# Runs the rest of its command line with SIGINT's default action, which Python turns into
# KeyboardInterrupt: what a program started from a terminal has. A shell script's background
# job (`cmd &`) inherits SIGINT ignored, and so would this test's program where the suite runs
# as one.
_AS_FROM_A_TERMINAL = [sys.executable, '-c', 'import os, signal, sys; '
                       'signal.signal(signal.SIGINT, signal.SIG_DFL); '
                       'os.execv(sys.executable, [sys.executable, *sys.argv[1:]])']


def test_ctrl_c_outside_training_ends_the_program_by_sigint_without_a_traceback():
  command = [*_AS_FROM_A_TERMINAL, '-m', 'vit_jax.benchmark', '--mode', 'infer', '--model',
             'ViT-testing', '--resolution', '16', '--batch', '1', '--steps', '1000000']
  with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        cwd=REPO) as process:
    said = []
    for line in process.stderr:  # Until it times its steps: imported, compiled, running.
      said.append(line)
      if line.startswith('benchmark: timing '):
        break
    process.send_signal(signal.SIGINT)
    try:
      said.append(process.communicate(timeout=120)[1])
    except subprocess.TimeoutExpired:
      process.kill()
      pytest.fail('still running 120 s after SIGINT:\n' + ''.join(said))
  said = ''.join(said)
  assert process.returncode == -signal.SIGINT, said
  assert 'Traceback' not in said and 'KeyboardInterrupt' not in said
