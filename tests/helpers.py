"""Shared test helpers."""

import dataclasses
import gzip
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np


def digits_config(model: str = 'ViT-testing', **overrides):
  """A tiny image-classification config on 8x8 digits: 20 steps of batch 32, 4x4 patches,
  every step logged, one evaluation (all 360 test digits) at the end, no checkpoint before."""
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.classification_config(model)
  config.model.patch_size = (4, 4)  # 8x8 digits -> 4 patches.
  config.data.image_size = 8
  config.batch_size = 32
  config.eval_batch_size = 360
  config.total_steps = 20
  config.optimizer.learning_rate = 1e-3
  config.log_every = 1
  config.eval_every = 0
  config.checkpoint_every = 0
  return override(config, overrides)


def override(config, overrides: dict):
  """Sets `config[a][b] = value` for each 'a.b' key in `overrides`; returns `config`."""
  for key, value in overrides.items():
    target = config
    *parents, leaf = key.split('.')
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config


def user_error(stderr: str) -> str:
  """The one line a user's mistake ends with (`error: ...`); fails on a traceback."""
  assert 'Traceback (most recent call last)' not in stderr, stderr
  last = stderr.rstrip('\n').rsplit('\n', 1)[-1]
  assert last.startswith('error: '), stderr
  return last


REPO = pathlib.Path(__file__).resolve().parents[1]
# A warning line of TensorFlow's or XLA's C++ logging ('W1204 10:00:00.1 123 x.cc:9] ...'),
# which no command or notebook should print.
NATIVE_WARNING = re.compile(r'^[WE]\d{4} [\d:. ]+\d+ \S+\.(cc|h):\d+\]', re.M)
# A narrow digits model, checkpoints every 2 steps (two kept), one evaluation at the end.
DIGITS_RUN = ['--config=configs/vit_digits.py', '--config.checkpoint_every=2',
              '--config.eval_every=0', '--config.log_every=1', '--config.batch_size=32',
              '--config.model.num_layers=1', '--config.model.hidden_size=32',
              '--config.model.mlp_dim=64', '--config.model.num_heads=2',
              '--config.eval_batch_size=360']


def digits_command(workdir, total_steps: int, *args: str) -> list[str]:
  """`python -m vit_jax.main` of DIGITS_RUN for `total_steps` steps in `workdir`."""
  return [sys.executable, '-m', 'vit_jax.main', *DIGITS_RUN, f'--config.total_steps={total_steps}',
          f'--workdir={workdir}', *args]


def final_eval(out: subprocess.CompletedProcess, total_steps: int) -> str:
  """The last evaluation line of a run that succeeded (what an uninterrupted run must equal)."""
  match = re.search(rf'eval at step {total_steps}: .*', out.stdout)
  assert out.returncode == 0 and match, out.stdout + out.stderr
  return match.group(0)


def assert_resumed_run_repeats(config, tmp_path, last_step: int, resume_step: int):
  """Runs `config` twice; the second loses its last checkpoint (as if killed after
  `resume_step`, in the middle of a metrics line) and resumes: its losses must equal the
  uninterrupted run's, and its metrics.jsonl log each step once."""
  from vit_jax import main  # pylint: disable=g-import-not-at-top
  uninterrupted, interrupted = str(tmp_path / 'uninterrupted'), str(tmp_path / 'interrupted')
  main.run(config, uninterrupted)
  main.run(config, interrupted)
  shutil.rmtree(os.path.join(interrupted, 'checkpoints', str(last_step)))
  with open(os.path.join(interrupted, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 999, "split": "tr')  # Cut short by the kill.
  main.run(config, interrupted)
  expected = read_metrics(uninterrupted, 'train')
  resumed = read_metrics(interrupted, 'train')
  assert [row['step'] for row in resumed] == [row['step'] for row in expected]
  np.testing.assert_allclose([row['loss'] for row in resumed],
                             [row['loss'] for row in expected], rtol=1e-5)
  del resume_step  # Where the second run resumes: its rows from there on are logged again.


def read_metrics(workdir, split):
  """The rows of WORKDIR/metrics.jsonl for `split` ('train' or 'test')."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [row for row in map(json.loads, f) if row['split'] == split]


def cached_teacher_forced_logits(model, params, inputs, targets):
  """Logits (B, T, V) from decoding `targets` one token at a time with the k/v cache."""
  decoder = model.clone(cached_decoding=True)
  cache = decoder.init(jax.random.key(0), inputs, targets)['cache']
  encoded = model.apply({'params': params}, inputs, method='encode')

  @jax.jit
  def step(cache, token):
    logits, updated = decoder.apply({'params': params, 'cache': cache}, encoded, inputs,
                                    token, method='decode', mutable=['cache'])
    return updated['cache'], logits[:, 0]

  token, steps = jnp.zeros((inputs.shape[0], 1), jnp.int32), []
  for t in range(targets.shape[1]):
    cache, logits = step(cache, token)
    steps.append(logits)
    token = targets[:, t:t + 1]  # Teacher forcing: the next input is target t.
  return jnp.stack(steps, axis=1)


# Runs `python -m MODULE ARGS...` and prints, after its other exit handlers, how many malloc
# arenas glibc made (malloc_info writes one <heap> per arena), whether Keras was imported, the
# garbage collector's full-collection threshold and how many objects were frozen.
_RUN_AND_INSPECT = """
import atexit, ctypes, gc, re, runpy, sys, tempfile

def inspect():
  libc = ctypes.CDLL('libc.so.6')
  libc.fopen.restype = ctypes.c_void_p
  with tempfile.NamedTemporaryFile() as out:
    stream = ctypes.c_void_p(libc.fopen(out.name.encode(), b'w'))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print('arenas:', len(re.findall(r'<heap nr=', open(out.name).read())))
  print('keras:', 'keras' in sys.modules)
  print('full collection threshold:', gc.get_threshold()[2])
  print('frozen:', gc.get_freeze_count())

atexit.register(inspect)
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


@dataclasses.dataclass(frozen=True)
class ProcessReport:
  arenas: int  # glibc's malloc arenas.
  keras: bool  # Whether Keras was imported.
  full_collection_threshold: int  # gc.get_threshold()[2].
  frozen: int  # gc.get_freeze_count() after the program's exit handlers.


def process_after(module: str, *args: str, cwd: str) -> ProcessReport:
  """What `python -m module *args` left at its exit, on the CPU (Linux), started without
  TF_USE_LEGACY_KERAS (which the tests set)."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_USE_LEGACY_KERAS'}
  env['JAX_PLATFORMS'] = 'cpu'
  out = subprocess.run([sys.executable, '-c', _RUN_AND_INSPECT, module, *args],
                       capture_output=True, text=True, cwd=cwd, env=env)
  assert out.returncode == 0, out.stderr
  report = dict(line.split(': ') for line in out.stdout.splitlines()[-4:])
  return ProcessReport(int(report['arenas']), report['keras'] == 'True',
                       int(report['full collection threshold']), int(report['frozen']))


def data_config(**overrides):
  """The image data config's defaults with `overrides`."""
  from vit_jax.data import images  # pylint: disable=g-import-not-at-top
  config = images.default_config()
  config.update(overrides)
  return config


def text_data_config(**overrides):
  """The text data config's defaults with `overrides`."""
  from vit_jax.data import text_config  # pylint: disable=g-import-not-at-top
  config = text_config.default_config()
  config.update(overrides)
  return config


def small_dates_config(**overrides):
  """A quick dates config: 600 train / 50 test examples, chars, no workdir needed."""
  return text_data_config(**{'dates_train_size': 600, 'dates_test_size': 50, **overrides})


def build_text(config, workdir=None, process_index=0, process_count=1):
  """`text.build` for one host of `process_count` (one by default)."""
  from vit_jax.data import text  # pylint: disable=g-import-not-at-top
  return text.build(config, workdir=workdir, process_index=process_index,
                    process_count=process_count)


def write_lines(path, lines, compress=False) -> str:
  """Writes `lines` to `path` (a pathlib.Path), one a line, gzipped if `compress`; its name."""
  data = ''.join(line + '\n' for line in lines).encode('utf-8')
  path.write_bytes(gzip.compress(data) if compress else data)
  return str(path)


def eval_arrays(dataset, batch_size):
  """All eval batches of one pass, concatenated: (images, labels, masks, number of batches)."""
  batches = list(dataset.eval_batches(batch_size))
  for batch in batches:
    assert batch['image'].shape == (batch_size, *dataset.image_shape)
    assert batch['image'].dtype == np.float32
    assert batch['label'].dtype == np.int32 and batch['mask'].dtype == np.float32
  joined = {key: np.concatenate([b[key] for b in batches]) for key in ('image', 'label', 'mask')}
  return joined['image'], joined['label'], joined['mask'], len(batches)


def real_examples(dataset, batch_size):
  """(image bytes, label) of every eval example with mask 1."""
  eval_images, labels, masks, _ = eval_arrays(dataset, batch_size)
  return [(image.tobytes(), int(label))
          for image, label, mask in zip(eval_images, labels, masks) if mask == 1]


def tmpfs_runner():
  """A command prefix that runs a shell script with its own tmpfs mounts (a disk that can be
  filled), or None where this machine cannot make them."""
  if shutil.which('unshare') is None:
    return None
  probe = subprocess.run(['unshare', '-rm', 'sh', '-c', 'mount -t tmpfs -o size=1m none /mnt'],
                         capture_output=True)
  return ['unshare', '-rm', 'sh', '-c'] if probe.returncode == 0 else None


@jax.jit
def slowly(outputs):
  """`outputs`, after a tenth of a second or so of 512x512 matrix products on the device, so
  that work queued without waiting piles up behind it."""
  work = jax.lax.fori_loop(0, 40, lambda _, x: jnp.tanh(x @ x), jnp.full((512, 512), 0.01))
  return jax.tree.map(lambda x: x + 0 * work[0, 0].astype(x.dtype), outputs)


def on_numpys_openblas(script: str, **env) -> subprocess.CompletedProcess:
  """Runs `script` in a fresh process whose BLAS is NumPy's bundled OpenBLAS (else skips)."""
  import pytest  # pylint: disable=g-import-not-at-top
  from vit_jax.kernels import blas  # pylint: disable=g-import-not-at-top
  numpy_blas = [b for b in blas._blas_candidates() if b.name == 'openblas']
  if not numpy_blas:
    pytest.skip('this NumPy has no bundled scipy-openblas')
  return subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                        env={**os.environ, 'VIT_JAX_BLAS': numpy_blas[0].path, **env},
                        timeout=300)
