"""What a run says while it works: nothing for quick work; for slow work, a line when it is
under way, progress counts, and a last line with the result and the time."""

import time

import pytest

from vit_jax import progress


def test_quick_work_says_nothing(capsys):
  with progress.phase('Reading data/train.en', unit='lines') as phase:
    phase.advance(10)
  assert capsys.readouterr() == ('', '')


def test_slow_work_says_when_it_starts_how_far_it_is_and_when_it_ends(capsys, monkeypatch):
  monkeypatch.setattr(progress, 'SLOW_SECONDS', 0.05)
  monkeypatch.setattr(progress, 'TICK_SECONDS', 0.0)
  with progress.phase('Decoding 3 sentences', total=3, unit='sentences') as phase:
    time.sleep(0.2)
    phase.advance(2)
    phase.advance(1)
  out, err = capsys.readouterr()
  assert out == ''  # stdout keeps a mode's own output.
  lines = err.splitlines()
  assert lines[0] == 'Decoding 3 sentences...'
  assert lines[1].startswith('  Decoding 3 sentences: 2 of 3 sentences (0m00s)')
  assert lines[3].startswith('Decoding 3 sentences: 3 of 3 sentences in 0.')


def test_failed_work_leaves_the_last_line_to_the_error(capsys, monkeypatch):
  monkeypatch.setattr(progress, 'SLOW_SECONDS', 0.05)
  with pytest.raises(ValueError):
    with progress.phase('Preparing TFDS dataset x') as phase:
      time.sleep(0.2)
      phase.result = 'never said'
      raise ValueError('offline')
  assert capsys.readouterr().err == 'Preparing TFDS dataset x...\n'
