"""Checkpoints that fail, from the command line: a corrupt latest checkpoint, a run killed while
saving, a full disk.

Each case runs `python -m vit_jax.main` in a subprocess on real files, and ends equal to the
uninterrupted run (the digits model is deterministic on the CPU).
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO, digits_command, final_eval, read_metrics, tmpfs_runner, user_error

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('checkpointing')

STEPS = 8  # Checkpoints at 2, 4, 6 and 8; two kept.


def run_main(workdir, *args) -> subprocess.CompletedProcess:
  return subprocess.run(digits_command(workdir, STEPS, *args), capture_output=True, text=True,
                        cwd=REPO, timeout=300)


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """An uninterrupted run: (its workdir, its final evaluation line)."""
  workdir = tmp_path_factory.mktemp('uninterrupted') / 'run'
  return workdir, final_eval(run_main(workdir), STEPS)


def _truncate_arrays(step_dir: pathlib.Path):
  """Cuts every array data file of a checkpoint to half, as a failing disk leaves them."""
  cut = 0
  for path in step_dir.rglob('*'):
    if path.is_file() and '/d/' in str(path) and path.stat().st_size > 64:
      path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
      cut += 1
  assert cut, sorted(str(p) for p in step_dir.rglob('*'))


def test_a_corrupt_latest_checkpoint_is_set_aside_and_training_resumes(finished, tmp_path):
  reference_dir, reference = finished
  workdir = tmp_path / 'run'
  shutil.copytree(reference_dir, workdir)
  (workdir / 'metrics.jsonl').unlink()  # So the rerun trains instead of reporting a finish.
  _truncate_arrays(workdir / 'checkpoints' / '8')

  # Readers other than training say what is wrong in one line, and fall back only when asked.
  out = run_main(workdir, '--config.trainer=evaluate')
  assert re.fullmatch(r'error: The checkpoint at step 8: .+ in \S+/checkpoints cannot be read; '
                      r'--config\.checkpoint_fallback=True takes the newest readable one '
                      r'\(step 6 or older\)\.', user_error(out.stderr)), out.stderr
  out = run_main(workdir, '--config.trainer=evaluate', '--config.checkpoint_fallback=True')
  assert out.returncode == 0 and 'eval of step 6:' in out.stdout, out.stdout + out.stderr
  assert 'The checkpoint at step 8: ' in out.stdout and 'trying step 6' in out.stdout
  out = subprocess.run([sys.executable, '-m', 'vit_jax.convert', str(workdir),
                        str(tmp_path / 'out.npz')], capture_output=True, text=True, cwd=REPO)
  assert 'cannot be read; --checkpoint-fallback takes the newest' in user_error(out.stderr)
  export = [sys.executable, '-m', 'vit_jax.export', str(workdir), str(tmp_path / 'exported'),
            '--format', 'stablehlo']
  out = subprocess.run(export, capture_output=True, text=True, cwd=REPO)
  assert 'cannot be read; --checkpoint-fallback takes the newest' in user_error(out.stderr)
  assert not (tmp_path / 'exported').exists()
  out = subprocess.run([*export, '--checkpoint-fallback'], capture_output=True, text=True,
                       cwd=REPO)
  assert out.returncode == 0, out.stderr
  assert 'at step 6' in json.loads((tmp_path / 'exported' / 'metadata.json').read_text())['source']

  # Training sets the broken one aside, resumes from step 6, and ends as if nothing happened.
  out = run_main(workdir)
  assert final_eval(out, STEPS) == reference
  assert 'Resumed from the checkpoint at step 6' in out.stdout
  notes = [line for line in out.stdout.splitlines() if 'cannot be read' in line]
  assert len(notes) == 1 and 'moved to' in notes[0] and 'unreadable-8' in notes[0], notes
  assert (workdir / 'checkpoints' / 'unreadable-8').is_dir()  # Kept, never deleted.
  assert (workdir / 'checkpoints' / '8').is_dir()  # Written again by the rerun.


def test_no_readable_checkpoint_is_one_line(finished, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(finished[0], workdir)
  for step in ('6', '8'):
    _truncate_arrays(workdir / 'checkpoints' / step)
  out = run_main(workdir, '--config.trainer=evaluate', '--config.checkpoint_fallback=True')
  assert re.fullmatch(r'error: No checkpoint in \S+ can be read \(step 8: .+; step 6: .+\)\. '
                      r'Rerun with a new --workdir to start afresh\.', user_error(out.stderr))


def test_readers_change_nothing_in_the_workdir(finished, tmp_path):
  """Evaluate, predict and convert read a workdir while a run may still be training in it."""
  workdir = tmp_path / 'run'
  shutil.copytree(finished[0], workdir)
  # A save in progress, as training's background save leaves it until it is renamed.
  in_progress = workdir / 'checkpoints' / '10.orbax-checkpoint-tmp'
  (in_progress / 'default').mkdir(parents=True)
  (in_progress / 'default' / 'part').write_bytes(b'x' * 100)
  checkpoints = workdir / 'checkpoints'
  before = sorted(str(p.relative_to(checkpoints)) for p in checkpoints.rglob('*'))
  metrics = (workdir / 'metrics.jsonl').read_bytes()
  events = sorted(p.name for p in (workdir / 'tensorboard').iterdir())

  # Another split, as a user checks a run: its figures must not become the run's test rows
  # (before, they were appended to metrics.jsonl, and a rerun of the finished run said them).
  out = run_main(workdir, '--config.trainer=evaluate', '--config.data.test_split=train')
  assert out.returncode == 0 and 'eval of step 8:' in out.stdout, out.stdout + out.stderr
  out = subprocess.run([sys.executable, '-m', 'vit_jax.convert', str(workdir),
                        str(tmp_path / 'out.npz')], capture_output=True, text=True, cwd=REPO)
  assert out.returncode == 0, out.stderr
  assert (in_progress / 'default' / 'part').read_bytes() == b'x' * 100
  assert sorted(str(p.relative_to(checkpoints)) for p in checkpoints.rglob('*')) == before
  assert (workdir / 'metrics.jsonl').read_bytes() == metrics
  assert sorted(p.name for p in (workdir / 'tensorboard').iterdir()) == events

  # Evaluating on a folder that labels its classes otherwise: one line; the run's class names
  # stay as training saved them.
  from vit_jax.data import make_image_folder  # pylint: disable=g-import-not-at-top
  folder = tmp_path / 'renamed'
  make_image_folder.make(str(folder), size=16, train_size=40, test_size=10)
  for split in ('train', 'test'):
    (folder / split / '0').rename(folder / split / 'zero')
  names = (workdir / 'class_names.json').read_text()
  out = run_main(workdir, '--config.trainer=evaluate', f'--config.data.dataset={folder}')
  assert re.fullmatch(r"error: config\.data\.dataset='\S+/renamed' \(10 classes\) does not label "
                      r'its classes as the run in \S+ learnt them \(10 classes, class_names\.json\): '
                      r"label 0 is '1' in the data, '0' in the run\. Use the data it was trained "
                      r'on, or a new --workdir to train on this data\.', user_error(out.stderr)), (
                          out.stderr)
  assert (workdir / 'class_names.json').read_text() == names

  # A mistyped workdir stays missing: one line, nothing created.
  typo = tmp_path / 'runn'
  out = run_main(typo, '--config.trainer=evaluate')
  assert re.fullmatch(r'error: No checkpoint in \S+/runn/checkpoints: train first, or point '
                      r'--workdir at a trained run\.', user_error(out.stderr)), out.stderr
  assert not typo.exists()


def test_a_run_killed_while_saving_resumes_from_the_last_whole_checkpoint(finished, tmp_path):
  """SIGKILL (the OOM killer, a lost machine) in the middle of an asynchronous save: the rerun
  resumes from the last checkpoint written whole and ends as the uninterrupted run."""
  _, reference = finished
  workdir = tmp_path / 'run'
  process = subprocess.Popen(digits_command(workdir, STEPS), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
  try:
    for line in process.stdout:
      if line.startswith('step 5/'):  # Step 2's save is whole; step 4's has begun.
        break
  finally:
    process.kill()
    process.communicate()
  assert process.returncode == -9
  # Here: ['2', '4.orbax-checkpoint-tmp'] (the save of step 4 was still being written).
  left = sorted(path.name for path in (workdir / 'checkpoints').iterdir())
  print(f'checkpoints left by the kill: {left}')
  whole = [name for name in left if name.isdigit()]
  unfinished = [name.split('.')[0] for name in left if not name.isdigit()]
  assert whole, left
  rerun = run_main(workdir)
  said = re.findall(r'^Removed the unfinished saves? of steps? ([\d, ]+) in \S+ \(the run '
                    r'that wrote it ended while saving\)\.$', rerun.stdout, re.M)
  assert said == ([', '.join(unfinished)] if unfinished else []), rerun.stdout
  assert f'Resumed from the checkpoint at step {max(whole, key=int)} in ' in rerun.stdout
  assert final_eval(rerun, STEPS) == reference
  assert sorted(path.name for path in (workdir / 'checkpoints').iterdir()) == ['6', '8']
  # The steps past the resumed one, logged before the kill, are logged once, by the rerun.
  assert [row['step'] for row in read_metrics(workdir, 'train')] == list(range(1, STEPS + 1))


def test_a_config_that_cannot_resume_leaves_the_saved_one(finished, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(finished[0], workdir)
  saved = (workdir / 'config.json').read_text()
  out = subprocess.run(digits_command(workdir, STEPS + 2, '--config.model.hidden_size=48'),
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert 'was written by a model of another shape' in user_error(out.stderr)
  assert (workdir / 'config.json').read_text() == saved
  # So the workdir still evaluates with the config that wrote it.
  out = subprocess.run([sys.executable, '-m', 'vit_jax.main', f'--workdir={workdir}',
                        '--config.trainer=evaluate'], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
  assert out.returncode == 0 and 'eval of step 8:' in out.stdout, out.stdout + out.stderr


def test_a_full_disk_stops_in_one_line_and_the_rerun_finishes(finished, tmp_path):
  runner = tmpfs_runner()
  if runner is None:
    pytest.skip('cannot mount a tmpfs here (unshare -rm)')
  reference_dir, reference = finished
  checkpoint_bytes = sum(p.stat().st_size for p in (reference_dir / 'checkpoints' / '8').rglob('*')
                         if p.is_file())
  disk = tmp_path / 'disk'
  disk.mkdir()
  workdir = disk / 'run'
  command = ' '.join(digits_command(workdir, STEPS))
  # Room for the config, the metrics and two checkpoints, not a third (kept = 2 + the new one).
  size_kb = (2 * checkpoint_bytes + checkpoint_bytes // 2) // 1024 + 64
  script = f'''
mount -t tmpfs -o size={size_kb}k none {disk}
cd {REPO}
{command} > {tmp_path}/full.out 2> {tmp_path}/full.err
echo $? > {tmp_path}/full.rc
ls {workdir}/checkpoints > {tmp_path}/full.ls
mount -o remount,size=64m {disk}
{command} > {tmp_path}/rerun.out 2> {tmp_path}/rerun.err
echo $? > {tmp_path}/rerun.rc
'''
  subprocess.run([*runner, script], check=True, timeout=600, env={**os.environ})
  full_err = (tmp_path / 'full.err').read_text()
  assert (tmp_path / 'full.rc').read_text().strip() == '1', full_err
  # Refused before writing, or failed while writing (which one depends on the filesystem's
  # block accounting): either way one line, with the sizes.
  said = re.fullmatch(r'error: (?:No space to save|The disk ran out of space while saving) the '
                      r'checkpoint at step (\d+) in \S+/checkpoints: .*[\d.,]+ [KM]B.*[\d.,]+ [KM]B '
                      r'are free.*; the earlier (?:checkpoint \(step (\d+)\) is|checkpoints '
                      r'\(steps ([\d, ]+)\) are) intact\. Free some space .*resume\.',
                      user_error(full_err))
  assert said, full_err
  assert 'Traceback' not in full_err
  kept = (tmp_path / 'full.ls').read_text().split()
  assert [name for name in kept if 'tmp' in name] == [], kept  # Nothing half-written.
  # Which save the disk stops depends on the filesystem's accounting and orbax's temporary
  # files; the message names the checkpoints that are on the disk, all older than the failed one.
  intact = (said.group(2) or said.group(3)).split(', ')
  assert intact == kept and all(int(step) < int(said.group(1)) for step in kept), (kept, full_err)
  rerun = (tmp_path / 'rerun.out').read_text()
  assert (tmp_path / 'rerun.rc').read_text().strip() == '0', (tmp_path / 'rerun.err').read_text()
  assert re.search(r'eval at step 8: .*', rerun).group(0) == reference


RESTORE_MEMORY = textwrap.dedent('''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    from vit_jax.train import checkpointing

    def params():  # 192 MB of float32.
      rng = np.random.default_rng(0)
      return {f'layer_{i}': {'kernel': rng.standard_normal((1024, 4096), np.float32)}
              for i in range(12)}

    def status(field):  # Bytes.
      with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

    if sys.argv[1] == 'write':  # The train state of a run with Adam: 3x the params.
      state = {'step': jnp.int32(1), 'params': params(), 'rng': jax.random.PRNGKey(0)}
      state['opt_state'] = optax.adam(1e-3).init(state['params'])
      with checkpointing.Checkpointer(sys.argv[2]) as checkpointer:
        checkpointer.save(1, state)
    else:
      jax.devices()
      # getrusage's peak starts at the parent's resident size (fork); VmHWM can be reset.
      with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
      before = status('VmRSS:')
      restored, step = checkpointing.restore_params(sys.argv[2])
      peak = status('VmHWM:')
      expected = params()
      print(json.dumps({'params_bytes': sum(x.nbytes for x in jax.tree.leaves(expected)),
                        'before': before, 'peak': peak, 'step': step,
                        'equal': jax.tree.all(jax.tree.map(np.array_equal, restored, expected))}))
''')


def _restore_memory(mode: str, workdir: str) -> str:
  out = subprocess.run([sys.executable, '-c', RESTORE_MEMORY, mode, workdir], cwd=REPO,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


@pytest.mark.skipif(not os.path.exists('/proc/self/clear_refs'), reason='needs Linux /proc')
def test_restoring_params_reads_only_the_params(tmp_path):
  """A workdir with Adam state (2x the params): restoring its params takes about their size."""
  workdir = str(tmp_path / 'adam')
  _restore_memory('write', workdir)
  result = json.loads(_restore_memory('read', workdir).strip().splitlines()[-1])
  assert result['step'] == 1 and result['equal']
  growth = result['peak'] - result['before']
  print(f'restore_params of {result["params_bytes"] / 2**20:.0f} MB of params (train state '
        f'{3 * result["params_bytes"] / 2**20:.0f} MB): peak resident memory grew by '
        f'{growth / 2**20:.0f} MB ({growth / result["params_bytes"]:.2f}x the params), from '
        f'{result["before"] / 2**20:.0f} MB to {result["peak"] / 2**20:.0f} MB')
  assert growth < 1.5 * result['params_bytes']


def test_a_reader_takes_the_newer_checkpoint_when_training_removes_the_one_it_reads(tmp_path):
  """Training keeps its newest checkpoints: the one a reader listed may be gone when read."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from vit_jax.train import checkpointing  # pylint: disable=g-import-not-at-top

  def state(value):
    return {'params': {'dense': {'kernel': np.full((4, 4), value, np.float32)}}}

  with checkpointing.Checkpointer(tmp_path, keep=1) as writer:
    writer.save(2, state(2))
  reader = checkpointing.Checkpointer(tmp_path, read_only=True)
  assert reader.latest_step() == 2
  with checkpointing.Checkpointer(tmp_path, keep=1) as writer:
    writer.save(4, state(4))  # Removes step 2.
  assert not (tmp_path / 'checkpoints' / '2').exists()
  params, step = reader.restore_params()
  reader.close()
  assert step == 4 and float(params['dense']['kernel'][0, 0]) == 4


def test_a_config_mistake_found_at_start_leaves_no_new_workdir_behind(tmp_path):
  new, existing = tmp_path / 'new', tmp_path / 'existing'
  existing.mkdir()
  for workdir in (new, existing):
    out = run_main(workdir, '--config.data.cutmix_prob=0.3')
    assert user_error(out.stderr).startswith('error: config.data.cutmix_prob=0.3 chooses')
  assert not new.exists()
  assert existing.is_dir()  # The user's own directory stays, with the lock file.


def test_a_second_run_in_a_workdir_in_use_stops_in_one_line(tmp_path):
  import fcntl  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  workdir.mkdir()
  with open(workdir / '.lock', 'w') as lock:  # As the first run holds it.
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write('pid 4242 on somehost\n')
    lock.flush()
    out = run_main(workdir)
  assert user_error(out.stderr) == (
      f'error: Another run (pid 4242 on somehost) is training in {workdir}; wait for it to end '
      '(or stop it), or give this run another --workdir.')
  assert sorted(os.listdir(workdir)) == ['.lock']
  out = run_main(workdir)  # Once it has ended.
  assert out.returncode == 0, out.stderr
