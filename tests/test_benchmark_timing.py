"""Timed steps: pipelined as training runs them, or isolated; the torch peers' devices."""

import concurrent.futures
import re
import time

import numpy as np
import pytest
from benchmark_helpers import TINY_VIT, run_benchmark
from test_benchmark_seq2seq import TINY_SEQ2SEQ

from vit_jax.benchmark import cli, timing


class _Device(timing.Runner):
  """Steps that take the host `launch_s` to start and the device `run_s` to run, one
  at a time in order, like a GPU's stream; records the order of starts and waits."""

  def __init__(self, launch_s: float, run_s: float):
    self.launch_s, self.run_s = launch_s, run_s
    self.stream = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self.events = []

  def start(self):
    step = sum(1 for kind, _ in self.events if kind == 'start')
    self.events.append(('start', step))
    time.sleep(self.launch_s)
    done = self.stream.submit(time.sleep, self.run_s)

    def wait():
      done.result()
      self.events.append(('ready', step))
    return wait


def test_pipelined_queues_the_next_step_before_waiting():
  device = _Device(0.0, 0.0)
  timing.time_alternating({'d': device}, steps=4, rounds=2, how='pipelined')
  events = device.events
  # Per round: one untimed step, then two timed; each step starts before the previous
  # one is waited for.
  assert sum(kind == 'start' for kind, _ in events) == 6
  for step in range(1, 6):
    if step in (1, 2, 4, 5):  # Not the first step of a round.
      assert events.index(('start', step)) < events.index(('ready', step - 1))
  assert events.index(('ready', 2)) < events.index(('start', 3))  # Rounds do not overlap.


def test_pipelined_hides_the_launch_that_isolated_steps_include():
  launch_s, run_s = 0.02, 0.04
  pipelined = timing.time_alternating({'d': _Device(launch_s, run_s)}, 6, 2, 'pipelined')
  isolated = timing.time_alternating({'d': _Device(launch_s, run_s)}, 6, 2, 'isolated')
  assert len(pipelined['d'].times) == len(isolated['d'].times) == 6
  # Sleeps never end early: an isolated step takes at least its launch and its run.
  assert np.median(isolated['d'].times) >= launch_s + run_s
  assert np.median(pipelined['d'].times) < run_s + launch_s / 2


def test_the_timing_flag(tmp_path, capsys):
  report, printed = run_benchmark(tmp_path, capsys, *TINY_VIT, '--timing', 'pipelined')
  assert report['args']['timing'] == 'pipelined'
  assert '| pipelined steps |' in printed  # Not what 'auto' takes on a CPU.
  assert report['ours']['steps_timed'] == 2
  report, printed = run_benchmark(tmp_path, capsys, *TINY_VIT)
  assert report['args']['timing'] == 'isolated'  # 'auto' on a CPU, unsaid.
  assert 'steps |' not in printed.splitlines()[0]
  with pytest.raises(SystemExit):
    cli.parse_args(['--mode', 'data', '--timing', 'isolated'])
  assert timing.resolve_timing('auto', 'gpu') == 'pipelined'


def test_torch_peer_of_seq2seq_runs_where_jax_does_in_bfloat16(tmp_path, capsys):
  pytest.importorskip('torch')
  report, _ = run_benchmark(tmp_path, capsys, *TINY_SEQ2SEQ, '--compare', 'torch',
                            '--dtype', 'bfloat16', '--embed-dim', '16', '--num-heads', '2',
                            '--mlp-dim', '24')
  assert report['torch_train']['tokens_per_s'] > 0
  assert report['torch_train']['torch_threads'] == report['device']['cpu_cores']


def test_a_run_says_on_stderr_what_it_has_compiled_and_what_it_times(tmp_path, capsys):
  assert cli.main([*TINY_VIT, '--json', str(tmp_path / 'out.json')]) == 0
  captured = capsys.readouterr()
  lines = captured.err.splitlines()
  assert len(lines) == 4, captured.err
  assert re.fullmatch(r'benchmark: our step compiled in \d+\.\d s', lines[0])
  assert lines[1] == 'benchmark: timing 2 isolated steps each of ours in 2 rounds'
  for done, line in enumerate(lines[2:], 1):  # Each round says it is done, with the figures.
    assert re.fullmatch(rf'benchmark: round {done}/2 done in \d+\.\d s; median so far: '
                        r'ours \d+\.\d ms/step', line), line
  assert captured.out.startswith('ViT-testing infer')  # The table stays on stdout.


def test_work_that_stalls_says_what_it_is_and_quick_work_says_nothing(capsys):
  with timing.said_if_slow('compiling the quick step', seconds=0.5):
    pass
  with timing.said_if_slow('compiling the slow step', seconds=0.05):
    time.sleep(0.3)
  with pytest.raises(ZeroDivisionError):
    with timing.said_if_slow('failing at once', seconds=0.2):
      1 / 0  # pylint: disable=pointless-statement
  time.sleep(0.4)  # Past every timer: only the slow step's was due.
  assert capsys.readouterr().err.splitlines() == [
      'benchmark: compiling the slow step (over 0.05 s so far)']
