"""A user's mistake on the command line: one line `error: ...` that says what was wrong, with
the value, and what to do, and a non-zero exit; a bug keeps its traceback."""

import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import NATIVE_WARNING, override, user_error

from vit_jax import main, models, weights
from vit_jax.train import config as config_lib

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('errors')

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_main(*args, cwd=REPO):
  return subprocess.run([sys.executable, '-m', 'vit_jax.main', *args], capture_output=True,
                        text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope='module')
def workdirs(tmp_path_factory):
  """A trained digits workdir, a trained dates workdir and published-layout .npz files."""
  root = tmp_path_factory.mktemp('errors')
  digits = config_lib.classification_config('ViT-testing')
  override(digits, {'model.patch_size': (4, 4), 'data.image_size': 8, 'batch_size': 16,
                    'eval_batch_size': 120, 'total_steps': 2, 'log_every': 1, 'eval_every': 0,
                    'checkpoint_every': 0})
  main.run(digits, str(root / 'digits'))
  dates = config_lib.translation_config('Transformer-testing')
  override(dates, {'data.dates_train_size': 64, 'data.dates_test_size': 8, 'batch_size': 8,
                   'eval_batch_size': 8, 'total_steps': 1, 'log_every': 1, 'eval_every': 0,
                   'checkpoint_every': 0, 'beam_size': 1, 'decode_batch_size': 8,
                   'data.max_length': 32})
  main.run(dates, str(root / 'dates'))
  wider = models.get_model('ViT-testing', num_classes=10, patch_size=(4, 4), hidden_size=48,
                           mlp_dim=96)
  params = wider.init(jax.random.key(0), np.zeros((1, 8, 8, 3)))['params']
  weights.save_npz(root / 'wider.npz', params)
  data = (root / 'wider.npz').read_bytes()
  (root / 'truncated.npz').write_bytes(data[:len(data) // 2])
  (root / 'notes.png').write_text('not an image\n')
  (root / 'sentences.txt').write_text('Sat, 7 February 1998\n')
  return root


DIGITS = '--config=configs/vit_digits.py'
# (arguments, what the error line must say); {root} is the fixture's directory.
CASES = {
    'unknown field': ([DIGITS, '--workdir={root}/new', '--config.total_stepz=3'],
                      r"config has no field 'total_stepz'\. Did you mean --config\.total_steps\?"),
    'unknown nested field': ([DIGITS, '--workdir={root}/new', '--config.model.hidden_sise=3'],
                             r"config\.model has no field 'hidden_sise'\. Did you mean "
                             r'--config\.model\.hidden_size\?'),
    'field in the wrong group': ([DIGITS, '--workdir={root}/new', '--config.image_size=3'],
                                 r'Did you mean --config\.data\.image_size'),
    'wrong type': ([DIGITS, '--workdir={root}/new', '--config.total_steps=abc'],
                   r'--config\.total_steps=abc: config\.total_steps takes an int \(it is 3000'),
    'wrong boolean': ([DIGITS, '--workdir={root}/new', '--config.data.flip=maybe'],
                      r'config\.data\.flip takes True or False'),
    'unknown model': (['--config=configs/vit.py:ViT-X_16,digits', '--workdir={root}/new'],
                      r"Unknown model 'ViT-X_16'\. Did you mean .*ViT-S_16"),
    'config argument': (['--config=configs/vit.py:ViT-B_16', '--workdir={root}/new'],
                        r'expected MODEL,DATASET after the .:., e\.g\. '
                        r'--config=configs/vit\.py:ViT-B_16,cifar10'),
    # A traceback of ml_collections' before: "get_config() takes 0 positional arguments".
    'argument to a config without one': (
        ['--config=configs/transformer_dates.py:big', '--workdir={root}/new'],
        r"--config=configs/transformer_dates\.py:big: configs/transformer_dates\.py takes no "
        r"argument after the ':'; give --config=configs/transformer_dates\.py, then "
        r'--config\.FIELD=VALUE to change its fields\.'),
    'model of the other task': ([DIGITS, '--workdir={root}/new',
                                 '--config.model.name=Transformer-base'],
                                r'--config\.model\.name=Transformer-base is a Transformer model, '
                                r'but the config is for VisionTransformer models'),
    'override before the config': (['--workdir={root}/new', '--config.total_steps=3', DIGITS],
                                   r'--config\.total_steps=3 comes before '
                                   r'--config=configs/vit_digits\.py, which it overrides: put '
                                   r'--config=FILE first'),
    'missing config file': (['--config=configs/nope.py', '--workdir={root}/new'],
                            r'the config file configs/nope\.py does not exist\. configs has .*'
                            r'vit_digits\.py'),
    'unknown matmul': ([DIGITS, '--workdir={root}/new', '--config.matmul=mkl'],
                       r"Unknown matmul implementation 'mkl'; choose one of \('auto', 'xla', "
                       r"'blas'\)"),
    'unknown dropout masks': ([DIGITS, '--workdir={root}/new', '--config.dropout_masks=fast'],
                              r"Unknown dropout masks 'fast'; choose one of \('hash', 'jax'\)"),
    'unknown dataset': ([DIGITS, '--workdir={root}/new', '--config.data.dataset=cifar11'],
                        r"Unknown dataset 'cifar11' \(config\.data\.dataset\).*Close TFDS "
                        r'names: .*cifar10'),
    'missing weights file': ([DIGITS, '--workdir={root}/new',
                              '--config.pretrained={root}/missing.npz'],
                             r'Checkpoint .*missing\.npz does not exist'),
    'missing teacher': (['--config=configs/deit.py:DeiT-testing,digits',
                         '--workdir={root}/new_student', '--config.teacher={root}/no_teacher',
                         '--config.distillation=hard'],
                        r"Teacher '.*no_teacher' \(config\.teacher\) does not exist: train the "
                        r'teacher there first'),
    # Before the data: offline, preparing cifar10 would retry its download for minutes.
    'missing teacher, TFDS data': (['--config=configs/deit.py:DeiT-testing,cifar10',
                                    '--workdir={root}/new_student', '--config.teacher={root}/no',
                                    '--config.distillation=hard',
                                    '--config.data.tfds_data_dir={root}/no_tfds'],
                                   r"Teacher '.*no' \(config\.teacher\) does not exist"),
    'missing image': (['--workdir={root}/digits', '--config.trainer=predict',
                       '--config.predict.inputs={root}/cat.jpg'],
                      r'Image file .*cat\.jpg \(config\.predict\.inputs\) does not exist'),
    'not an image': (['--workdir={root}/digits', '--config.trainer=predict',
                      '--config.predict.inputs={root}/notes.png'],
                     r'None of the 1 file\(s\) of config\.predict\.inputs is an image that can '
                     r'be read\.'),
    'workdir is a file': ([DIGITS, '--workdir={root}/notes.png'],
                          r'--workdir=\S+notes\.png is a file; give a directory'),
    'workdir of the other task': ([DIGITS, '--workdir={root}/dates'],
                                  r'--workdir=.*dates holds a translation run \(its config\.json'
                                  r'\), not a classification one'),
    'mode of the other task': (['--workdir={root}/dates', '--config.trainer=predict'],
                               r"config\.trainer='predict' is not a mode of the translation task;"
                               r' choose one of train, evaluate, translate, visualize'),
    'npz of another architecture': (
        [DIGITS, '--workdir={root}/new', '--config.pretrained={root}/wider.npz',
         '--config.model.patch_size=(4, 4)'],
        r'wider\.npz does not fit the model: \d+ mismatched parameter\(s\) \(file vs model: '
        r'.*embedding/kernel: \(4, 4, 3, 48\) vs \(4, 4, 3, 64\)'),
    'corrupt npz': ([DIGITS, '--workdir={root}/new', '--config.pretrained={root}/truncated.npz'],
                    r'Cannot read checkpoint .*truncated\.npz: .*truncated or corrupt'),
    'bad dtype': ([DIGITS, '--workdir={root}/new', '--config.model.dtype=bf16'],
                  r"dtype='bf16' is not a floating-point dtype; use 'float32', 'bfloat16'"),
    'no workdir': ([DIGITS], r'--workdir is required'),
    'empty workdir': ([DIGITS, '--workdir='], r"--workdir='' is empty; give a directory"),
    # A beam whose buffers (hundreds of GB) exceed the machine's memory (a JAX traceback before).
    'out of memory': (['--workdir={root}/dates', '--config.trainer=translate',
                       '--config.input_file={root}/sentences.txt', '--config.beam_size=1000000'],
                      r'^error: Out of memory in trainer=translate \(XLA: Out of memory '
                      r'allocating \d+ bytes\): lower --config\.decode_batch_size \(now 8\), or '
                      r'lower --config\.beam_size \(now 1000000\)\.$'),
    'no config': (['--workdir={root}/nothing'], r'No --config given and --workdir=.*nothing holds '
                                                r'no config\.json of an earlier run'),
    # The overrides of a mode that reads a workdir find no fields where there is no run.
    'no config, overrides': (['--workdir={root}/nothing', '--config.trainer=visualize',
                              '--config.visualize.num_examples=1'],
                             r'No --config given and --workdir=.*nothing holds no config\.json'),
    'no config, no workdir': (['--config.total_steps=3'],
                              r'No --config and no --workdir given: pass --config=configs/FILE\.py '
                              r'and --workdir=DIR'),
}


@pytest.mark.parametrize('case', CASES)
def test_a_mistake_is_one_line(case, workdirs):
  args, expected = CASES[case]
  out = run_main(*[arg.format(root=workdirs) for arg in args])
  assert out.returncode != 0
  line = user_error(out.stderr)
  assert re.search(expected, line), line
  assert not NATIVE_WARNING.search(out.stderr), out.stderr  # No C++ log line before it.
  assert not list(workdirs.glob('new/checkpoints/[0-9]*'))  # Nothing was trained.
  assert not (workdirs / 'new_student').exists()  # Found while building the task: no workdir.


def test_a_bug_keeps_its_traceback(tmp_path):
  (tmp_path / 'broken.py').write_text(
      'from vit_jax.train import config\n\n\ndef get_config():\n'
      '  return config.classification_config().not_a_field_bug\n')
  out = run_main(f'--config={tmp_path}/broken.py', f'--workdir={tmp_path}/run')
  assert out.returncode != 0
  assert 'Traceback (most recent call last)' in out.stderr
  assert 'not_a_field_bug' in out.stderr
