"""Remote paths: a workdir, pretrained weights and predict's inputs on a filesystem that is not
local. TensorFlow's in-memory `ram://` filesystem stands in for gs:// and s3:// (it needs no
network, and lives as long as the process, so the runs share this test's process)."""

import errno
import gc
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import uuid

import jax
import numpy as np
import pytest
from PIL import Image
from helpers import NATIVE_WARNING, REPO, digits_command, override, tmpfs_runner, user_error

from vit_jax import errors, files, main, models, run_metrics, weights
from vit_jax.data import sources
from vit_jax.train import config as config_lib

tf = pytest.importorskip('tensorflow')


def tiny_config(**overrides):
  config = config_lib.classification_config('ViT-testing')
  override(config, {'model.patch_size': (4, 4), 'data.image_size': 8, 'batch_size': 32,
                    'eval_batch_size': 120, 'total_steps': 10, 'log_every': 5,
                    'eval_every': 10, 'checkpoint_every': 5})
  return override(config, overrides)


@pytest.fixture
def ram():
  root = f'ram://vit_jax_test_{uuid.uuid4().hex}'
  yield root
  if tf.io.gfile.exists(root):
    tf.io.gfile.rmtree(root)


def test_train_resume_evaluate_and_predict_with_a_remote_workdir(ram, capsys, tmp_path,
                                                                 monkeypatch):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))  # Where local copies are made.
  workdir = f'{ram}/runs/digits'
  first = main.run(tiny_config(), workdir)
  assert first['num_examples'] == 360
  listed = set(tf.io.gfile.listdir(workdir))
  assert {'config.json', 'metrics.jsonl', 'class_names.json', 'checkpoints'} <= listed
  assert sorted(files.listdir(f'{workdir}/checkpoints')) == [
      '.uploaded-10', '.uploaded-5', '10', '5']
  assert tf.io.gfile.listdir(f'{workdir}/tensorboard')

  resumed = main.run(tiny_config(total_steps=15), workdir)
  assert 'Resumed from the checkpoint at step 10 in ' + workdir in capsys.readouterr().out
  assert run_metrics.read_series(workdir)['train']['loss'][0].tolist() == [5, 10, 15]
  # keep_checkpoints=2: the older remote step went with the local one.
  assert sorted(files.listdir(f'{workdir}/checkpoints')) == [
      '.uploaded-10', '.uploaded-15', '10', '15']

  evaluated = main.run(tiny_config(trainer='evaluate', total_steps=15), workdir)
  assert evaluated['accuracy'] == pytest.approx(resumed['accuracy'])

  digits, _ = sources.digits_splits()['test']
  for i in range(3):
    buffer = io.BytesIO()
    Image.fromarray(digits[i, :, :, 0]).save(buffer, format='PNG')
    with tf.io.gfile.GFile(f'{ram}/inputs/{i}.png', 'wb') as f:
      f.write(buffer.getvalue())
  config = tiny_config(trainer='predict', total_steps=15, **{
      'predict.inputs': f'{ram}/inputs/*.png', 'predict.output_file': f'{ram}/top.jsonl'})
  results = main.run(config, workdir)
  assert [r['file'] for r in results] == [f'{ram}/inputs/{i}.png' for i in range(3)]
  written = [json.loads(line) for line in files.read_text(f'{ram}/top.jsonl').splitlines()]
  assert written == results
  assert all(len(r['predictions']) == 5 for r in results)

  # A run that fails after reading the checkpoints leaves no local copy of them behind either.
  with pytest.raises(errors.ConfigError, match='was written by a model of another shape'):
    main.run(tiny_config(total_steps=20, **{'model.hidden_size': 16}), workdir)
  gc.collect()
  assert not list(tmp_path.glob('vit_jax_checkpoints_*'))


def test_fine_tune_from_a_remote_npz(ram):
  model = models.get_model('ViT-testing', num_classes=5, patch_size=(4, 4))
  params = model.init(jax.random.key(1), np.zeros((1, 16, 16, 3)))['params']
  weights.save_npz(f'{ram}/ViT-testing.npz', params)
  assert files.exists(f'{ram}/ViT-testing.npz')
  results = main.run(tiny_config(pretrained=f'{ram}/ViT-testing.npz', total_steps=5,
                                 checkpoint_every=0, eval_every=0), f'{ram}/finetune')
  assert results['num_examples'] == 360
  with pytest.raises(FileNotFoundError, match='does not exist'):
    main.run(tiny_config(pretrained=f'{ram}/missing.npz'), f'{ram}/other')


def test_files_round_trip_on_both_kinds_of_path(ram, tmp_path):
  for root in (ram, str(tmp_path)):
    path = files.join(root, 'a', 'b.txt')
    files.write_text_atomically(path, 'hello\n')
    assert files.read_text(path) == 'hello\n' and files.exists(path)
    assert files.listdir(files.join(root, 'a')) == ['b.txt']
    with files.open_file(path, 'a') as f:
      f.write('again\n')
    assert files.read_bytes(path) == b'hello\nagain\n'
    files.copy_tree(files.join(root, 'a'), files.join(root, 'copy'))
    assert list(files.walk_files(files.join(root, 'copy'))) == ['b.txt']
    files.remove_tree(files.join(root, 'copy'))
    assert not files.exists(files.join(root, 'copy'))
    with pytest.raises(FileNotFoundError, match='missing.txt does not exist'):
      files.read_bytes(files.join(root, 'missing.txt'))


@pytest.fixture(name='web')
def web_fixture():
  """http://127.0.0.1:PORT/NAME serving `served[NAME]`; other names get HTTP 404, and 'broken'
  HTTP 500."""
  served = {}

  class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):  # pylint: disable=invalid-name
      name = self.path.lstrip('/')
      code = 200 if name in served else 500 if name == 'broken' else 404
      body = served.get(name, b'')
      self.send_response(code)
      self.send_header('Content-Length', str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):
      del args

  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield f'http://127.0.0.1:{server.server_address[1]}', served
  server.shutdown()
  server.server_close()


def test_http_files_read_or_say_why_not(web):
  url, served = web
  served['ViT.npz'] = b'weights'
  assert files.read_bytes(f'{url}/ViT.npz') == b'weights'
  with pytest.raises(FileNotFoundError, match=r'missing.npz does not exist \(HTTP 404\)'):
    files.read_bytes(f'{url}/missing.npz')
  with pytest.raises(errors.DataUnavailableError, match=r'Cannot read .*/broken: HTTP 500'):
    files.read_bytes(f'{url}/broken')


def test_a_scheme_tensorflow_has_no_filesystem_for_says_so(ram):
  with pytest.raises(errors.ConfigError) as error:
    files.read_bytes('gz://vit_models/ViT-B_16.npz')  # A typo of gs://.
  assert str(error.value).startswith('Cannot read gz://vit_models/ViT-B_16.npz: TensorFlow '
                                     '(tf.io.gfile) has no filesystem for gz:// here')
  assert 'tensorflow-io' in str(error.value)
  # config.pretrained: named as given (not as PATH/config.json, which is how a workdir is told).
  with pytest.raises(errors.ConfigError, match=r'^Cannot read gz://vit_models/ViT-B_16.npz:'):
    main.run(tiny_config(pretrained='gz://vit_models/ViT-B_16.npz'), f'{ram}/run')


def test_pretrained_weights_at_an_unreachable_url_are_one_line(tmp_path):
  # Port 9 (discard) is closed: a refused connection, as offline.
  out = subprocess.run(digits_command(tmp_path / 'run', 2,
                                      '--config.pretrained=http://127.0.0.1:9/ViT-B_16.npz'),
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode != 0
  error = user_error(out.stderr)
  assert error.startswith('error: Cannot reach http://127.0.0.1:9/ViT-B_16.npz: '), error
  assert 'Connection refused. Check the network connection' in error


def test_a_public_bucket_without_credentials_prints_no_native_warning():
  """TensorFlow's 'All attempts to get a Google authentication bearer token failed' (C++, at
  the first gs:// request without credentials, which gs://vit_models needs none of)."""
  script = ('from vit_jax import errors, files\n'
            'try:\n'
            "  print(files.exists('gs://vit_models/imagenet21k/no-such-file.npz'))\n"
            'except errors.DataUnavailableError:  # Offline.\n'
            "  print('unreachable')\n")
  out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() in ('False', 'unreachable'), out.stdout
  assert not NATIVE_WARNING.search(out.stderr), out.stderr


def test_an_output_that_does_not_fit_leaves_the_old_file_and_says_so(tmp_path):
  path = tmp_path / 'attention_0.png'
  path.write_bytes(b'the last complete picture')

  def write_until_full(tmp):
    with open(tmp, 'wb') as f:
      f.write(b'half a pic')
    raise OSError(errno.ENOSPC, 'No space left on device')

  with pytest.raises(errors.DiskFullError) as error:
    files.write_atomically(str(path), write_until_full)
  assert str(error.value).startswith(f'No space to write {path} (No space left on device, ')
  assert 'MiB free in' in str(error.value) and 'write elsewhere' in str(error.value)
  assert path.read_bytes() == b'the last complete picture'
  assert os.listdir(tmp_path) == ['attention_0.png']  # The partial file is gone.


def test_a_full_disk_is_one_line_for_pictures_metrics_and_exports(tmp_path):
  """trainer=visualize's PNGs, a run's metrics.jsonl, a converted .safetensors and an exported
  model on a disk that fills: one line naming the file (tracebacks before), no partial picture
  left."""
  runner = tmpfs_runner()
  if runner is None:
    pytest.skip('cannot mount a tmpfs here (unshare -rm)')
  disk, trained = tmp_path / 'disk', tmp_path / 'trained'
  disk.mkdir()
  visualize = ' '.join([sys.executable, '-m', 'vit_jax.main', f'--workdir={trained}',
                        '--config.trainer=visualize', f'--config.visualize.output_dir={disk}/vis'])
  train = ' '.join(digits_command(disk / 'run', 20, '--config.checkpoint_every=0'))
  script = f'''
cd {REPO}
{' '.join(digits_command(trained, 2))} > /dev/null 2>&1 || exit 3
mount -t tmpfs -o size=64k none {disk}
head -c 61440 /dev/zero > {disk}/fill
{visualize} > /dev/null 2> {tmp_path}/visualize.err
{train} > /dev/null 2> {tmp_path}/train.err
ls -A {disk}/vis > {tmp_path}/vis.ls
{sys.executable} -m vit_jax.convert {trained} {disk}/w.safetensors 2> {tmp_path}/convert.err
{sys.executable} -m vit_jax.export {trained} {disk}/exported --format stablehlo \
  > /dev/null 2> {tmp_path}/export.err
exit 0
'''
  subprocess.run([*runner, script], check=True, timeout=600, env={**os.environ})
  visualize_error = user_error((tmp_path / 'visualize.err').read_text())
  assert visualize_error.startswith(f'error: No space to write {disk}/vis/attention_0.png (No '
                                    'space left on device, '), visualize_error
  assert (tmp_path / 'vis.ls').read_text() == ''
  train_error = user_error((tmp_path / 'train.err').read_text())
  assert re.match(rf'error: No space to write {disk}/run/\S+ \(No space left on device, [\d.]+ '
                  r'MiB free in ', train_error), train_error
  for tool, output in (('convert', 'w.safetensors'), ('export', 'exported')):
    error = user_error((tmp_path / f'{tool}.err').read_text())
    assert error.startswith(f'error: No space to write {disk}/{output} ('), error
    assert 'No space left on device' in error, error


def test_image_urls_read_as_the_files_they_serve(web, tmp_path):
  """config.predict.inputs and config.visualize.inputs may be http(s) URLs (they were 'does not
  exist' and a TensorFlow traceback)."""
  from vit_jax.data import images  # pylint: disable=g-import-not-at-top
  from vit_jax.train import prediction  # pylint: disable=g-import-not-at-top
  url, served = web
  png = tmp_path / 'digit.png'
  Image.fromarray(np.arange(192, dtype=np.uint8).reshape(8, 8, 3)).save(png)
  served['digit.png'] = png.read_bytes()
  config = {'image_size': 8}
  np.testing.assert_array_equal(images.load_files([f'{url}/digit.png'], config),
                                images.load_files([str(png)], config))
  with pytest.raises(FileNotFoundError, match=r'missing.png does not exist \(HTTP 404\)'):
    images.load_files([f'{url}/missing.png'], config)
  assert prediction.expand_inputs(f'{url}/digit.png,{png}') == [f'{url}/digit.png', str(png)]
