"""SIGTERM and SIGINT, from the command line: the run saves the step it is in and resumes there.

One digits run is preempted ten times at random moments (while JAX starts and compiles,
between steps, during an asynchronous save); each rerun of the same command resumes from
the step the signal stopped, and the last one ends equal to the uninterrupted run.
"""

import random
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, digits_command, final_eval

STEPS = 40
SIGNALS = 10


def _run(workdir, *args) -> subprocess.CompletedProcess:
  return subprocess.run(digits_command(workdir, STEPS, *args), capture_output=True, text=True,
                        cwd=REPO, timeout=300)


def _signalled(workdir, delay: float, after: str | None) -> tuple[int, str, str]:
  """Starts the run, sends SIGTERM `delay` s after it prints `after` (None: after it starts).

  Returns (exit code, stdout, stderr).
  """
  process = subprocess.Popen(digits_command(workdir, STEPS), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
  head = ''
  if after is not None:
    for line in process.stdout:
      head += line
      if line.startswith(after):
        break
  time.sleep(delay)
  process.send_signal(signal.SIGTERM)
  out, err = process.communicate(timeout=300)
  return process.returncode, head + out, err


def _last_step_logged(stdout: str, before: str) -> int:
  """The last `step N/...` line printed before the line containing `before` (0: none)."""
  head = stdout.split(before, 1)[0]
  steps = re.findall(r'^step (\d+)/', head, re.M)
  return int(steps[-1]) if steps else 0


def test_sigterm_at_random_moments_loses_no_step(tmp_path):
  reference = final_eval(_run(tmp_path / 'uninterrupted'), STEPS)
  workdir = tmp_path / 'preempted'
  rng = random.Random(0)
  resumed_from, stopped, lost = 0, [], []
  for i in range(SIGNALS):
    # Two while the process starts (importing, restoring), one from the start of training on
    # (while the first step compiles), the others a moment after one of the next three steps
    # (between steps, during a save): anchored to steps, so that the run cannot finish before
    # the last signal however fast the machine (8 signals stop at most 10 + 7 x 4 steps in).
    if i < 2:
      code, out, err = _signalled(workdir, rng.uniform(0.5, 3.0), after=None)
    elif i == 2:
      code, out, err = _signalled(workdir, rng.uniform(0.0, 1.0), after='Training ')
    else:
      step = resumed_from + rng.randint(1, 3)
      code, out, err = _signalled(workdir, rng.uniform(0.0, 0.1), after=f'step {step}/')
    resumed = re.search(r'Resumed from the checkpoint at step (\d+)', out)
    if code == -signal.SIGTERM:  # Before training began (starting, restoring): nothing lost.
      assert not re.search(r'^step \d+/', out, re.M), (out, err)
      continue
    assert (int(resumed.group(1)) if resumed else 0) == resumed_from, out
    if code == 0:  # The run finished before the signal.
      break
    assert code == 128 + signal.SIGTERM, (code, out, err)
    step = int(re.search(r'Stopped by SIGTERM at step (\d+) of 40: the checkpoint of step \d+ '
                         r'is in \S+\. Run the same command to resume\.', err).group(1))
    # The signal arrived after step `arrived` (the last logged, else the one resumed from):
    # at most one more step ran.
    arrived = max(_last_step_logged(out, 'SIGTERM: stopping after this step'), resumed_from)
    assert step - arrived in (0, 1), (step, arrived, out)
    stopped.append(step)
    resumed_from = step
    lost.append(0)  # The next run must resume from `step` itself (checked above).
  assert len(stopped) >= SIGNALS - 2, stopped  # Those sent once training began.
  finished = _run(workdir)
  if stopped:
    assert f'Resumed from the checkpoint at step {stopped[-1]}' in finished.stdout
  assert final_eval(finished, STEPS) == reference
  print(f'signals survived: {len(stopped)} stopped cleanly, steps lost per signal: {lost}')


def test_a_second_signal_stops_at_once():
  """The first signal only asks; the second ends the process as if no handler were set."""
  script = (
      'import os, signal\n'
      'from vit_jax.train import preemption\n'
      'with preemption.StopRequests() as stop:\n'
      '  os.kill(os.getpid(), signal.SIGTERM)\n'
      "  print('asked', stop.requested(1), flush=True)\n"
      '  os.kill(os.getpid(), signal.SIGTERM)\n'
      "  print('still running')\n")
  out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
  assert out.returncode == -signal.SIGTERM, (out.returncode, out.stdout, out.stderr)
  assert 'asked True' in out.stdout and 'still running' not in out.stdout
  assert 'SIGTERM: stopping after this step' in out.stdout


@pytest.mark.parametrize('signum', [signal.SIGINT])
def test_sigint_saves_like_sigterm(tmp_path, signum):
  process = subprocess.Popen(digits_command(tmp_path / 'run', STEPS), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
  for line in process.stdout:
    if line.startswith('step 3/'):
      break
  process.send_signal(signum)
  out, err = process.communicate(timeout=60)
  assert process.returncode == 128 + signum, err
  step = int(re.search(r'Stopped by SIGINT at step (\d+)', err).group(1))
  rerun = _run(tmp_path / 'run')
  assert f'Resumed from the checkpoint at step {step}' in rerun.stdout
