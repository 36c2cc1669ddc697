"""Every documented command runs as written.

The commands (`python -m vit_jax...`) are taken from README.md (each section on its own),
from each configs/*.py docstring and from the notebooks' text, and run in a subprocess with
bash, in document order, from a directory laid out like the repository's root (configs/ is
there). Each run appends only overrides that shrink it (steps, sizes, widths); the files an
example names (a .npz, an image folder, a corpus, a teacher's workdir, photos) are generated
there first (the overrides and the expected output: tests/docs_rules.py). A command that needs
the network runs until its one-line error says it cannot download. A command no rule knows
runs without overrides and must succeed: a new documented command is tested from the moment
it is written down.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import numpy as np
import pytest
from docs_rules import OFFLINE, RULES, TINY_DIGITS, Rule
from helpers import NATIVE_WARNING
from PIL import Image

# One worker runs every source (--dist=loadgroup): the workdirs many of them start from
# (`trained_runs`) are then trained once, not once per worker.
pytestmark = pytest.mark.xdist_group('docs')

REPO = pathlib.Path(__file__).resolve().parents[1]
COMMAND = re.compile(r'python -m vit_jax\.\w+')


# ------------------------------------------------------------------------------ Commands


def _logical_lines(text: str) -> list[str]:
  """Lines with backslash continuations joined and trailing `# comments` dropped."""
  lines, current = [], ''
  for raw in text.splitlines():
    if raw.rstrip().endswith('\\'):
      current += raw.strip()[:-1].rstrip() + ' '
      continue
    line = (current + raw.strip()).strip()
    current = ''
    if line and not line.startswith('#'):
      lines.append(re.sub(r'\s+#\s[^\'"]*$', '', line))
  return lines


def _shell_lines(text: str) -> list[str]:
  """The lines of a block that a user runs: vit_jax commands and the `export`s they need.

  An install-and-run line (`python3 -m venv ... && pip install ... && python -m vit_jax...`)
  keeps its vit_jax part: the tests run in the installed package already.
  """
  kept = []
  for line in _logical_lines(text):
    if line.startswith('export '):
      kept.append(line)
    elif COMMAND.search(line):
      parts = [p.strip() for p in line.split(' && ')]
      kept.append(' && '.join(p for p in parts if COMMAND.search(p)) if 'pip install' in line
                  else line)
  return kept


def _markdown_commands(markdown: str) -> list[str]:
  """Commands of fenced non-Python blocks and of inline `python -m vit_jax...` spans."""
  commands = []
  pieces = re.split(r'^```(\w*)\n(.*?)^```', markdown, flags=re.S | re.M)
  for i in range(0, len(pieces), 3):
    for span in re.findall(r'`(python -m vit_jax\.[^`]+)`', pieces[i]):
      commands.append(span.strip())
    if i + 2 < len(pieces) and pieces[i + 1] not in ('python', 'py'):
      commands += _shell_lines(pieces[i + 2])
  return commands


# Sections whose ```python blocks are clients of what their commands wrote: each block runs
# (`python -c`) after the commands, in the same directory, and must succeed.
CLIENT_SECTIONS = ('README.md: Serving: StableHLO, TensorFlow SavedModel, ONNX',)


def _python_blocks(source: str) -> list[str]:
  title = source.split(': ', 1)[1]
  text = (REPO / 'README.md').read_text()
  body = re.split(r'^###? ', text, flags=re.M)
  section = next(s for s in body if s.partition('\n')[0].strip() == title)
  return re.findall(r'^```python\n(.*?)^```', section, flags=re.S | re.M)


def _readme_sections() -> dict[str, list[str]]:
  """The commands of each `##` or `###` section of README.md, which run on their own."""
  text = (REPO / 'README.md').read_text()
  sections = re.split(r'^###? ', text, flags=re.M)
  found = {}
  for section in sections[1:]:
    title, _, body = section.partition('\n')
    commands = _markdown_commands(body)
    if commands:
      found[f'README.md: {title.strip()}'] = commands
  return found


def _config_docstrings() -> dict[str, list[str]]:
  import ast  # pylint: disable=g-import-not-at-top
  found = {}
  for path in sorted((REPO / 'configs').glob('*.py')):
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ''
    found[f'configs/{path.name}'] = _shell_lines(docstring)
  return found


def _notebook_text() -> dict[str, list[str]]:
  found = {}
  for path in sorted((REPO / 'colab').glob('*.ipynb')):
    notebook = nbformat.read(path, as_version=4)
    markdown = '\n\n'.join(cell.source for cell in notebook.cells if cell.cell_type == 'markdown')
    found[f'colab/{path.name}'] = _markdown_commands(markdown)
  return found


SOURCES = {**_readme_sections(), **_config_docstrings(), **_notebook_text()}


def _rule(command: str) -> Rule:
  for rule in RULES:
    if re.search(rule.pattern, command):
      return rule
  return Rule('')


def _with_overrides(command: str, extra: str) -> str:
  """`extra` after each `python -m vit_jax.X ARGS` of a shell line, before `&`, `|` or `;`."""
  if not extra:
    return command
  out, position = [], 0
  for match in COMMAND.finditer(command):
    end = match.end()
    quote = None
    while end < len(command):
      char = command[end]
      if quote:
        quote = None if char == quote else quote
      elif char in '\'"':
        quote = char
      elif char in '&|;':
        break
      end += 1
    out.append(command[position:end].rstrip() + ' ' + extra + (' ' if end < len(command)
                                                                 else ''))
    position = end
  return ''.join(out) + command[position:]


# ------------------------------------------------------------------------------ Files the
# examples name, generated where they name them.


def _save_vit_npz(path: pathlib.Path, image_size: int = 224, **narrow):
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import models, weights  # pylint: disable=g-import-not-at-top
  model = models.get_model('ViT-B_16', num_classes=1000, **narrow)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                             np.zeros((1, image_size, image_size, 3))))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32),
                        shapes['params'])
  path.parent.mkdir(parents=True, exist_ok=True)
  weights.save_npz(path, weights.canonicalize(params))


NARROW_FIELDS = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1)


def _save_timm_deit_s(path: pathlib.Path):
  """A random DeiT-S/16 in timm's layout, as `deit_small_distilled_patch16_224` is published."""
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import models, weights  # pylint: disable=g-import-not-at-top
  model = models.get_model('DeiT-S_16', num_classes=1000)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), np.zeros((1, 224, 224, 3))))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32),
                        shapes['params'])
  weights.save_safetensors(path, weights.to_timm(weights.canonicalize(params)))


def _images(folder: pathlib.Path, count: int, suffix: str, size=(20, 16), gray=False):
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(len(str(folder)))
  for i in range(count):
    shape = size[::-1] if gray else (*size[::-1], 3)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(folder / f'{i}{suffix}')


def _image_folder(root: pathlib.Path):
  for split in ('train', 'test'):
    for label in ('cat', 'dog'):
      _images(root / split / label, 4, '.png')


def _corpus(data: pathlib.Path):
  """Parallel text: number words in English and German, one sentence per line."""
  words = {'en': 'one two three four five six seven eight nine ten'.split(),
           'de': 'eins zwei drei vier fuenf sechs sieben acht neun zehn'.split()}
  rng = np.random.default_rng(0)
  data.mkdir(parents=True, exist_ok=True)
  for split, count in (('train', 300), ('val', 24)):
    rows = [rng.integers(0, 10, rng.integers(2, 6)) for _ in range(count)]
    for language, vocabulary in words.items():
      (data / f'{split}.{language}').write_text(
          ''.join(' '.join(vocabulary[i] for i in row) + '\n' for row in rows))


def _fake_cifar10(data_dir: pathlib.Path):
  """cifar10 prepared in data_dir (random images, the real features), as TFDS would have it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder('cifar10', data_dir=str(data_dir))
  if builder.is_prepared():
    return
  rng = np.random.default_rng(0)

  def split(n):
    return tf.data.Dataset.from_tensor_slices({
        'id': [f'x{i}' for i in range(n)], 'label': rng.integers(0, 10, n),
        'image': rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)})

  tfds.dataset_builders.store_as_tfds_dataset(
      name='cifar10', version=str(builder.version), data_dir=str(data_dir),
      features=builder.info.features, split_datasets={'train': split(40), 'test': split(16)})


def _run(command: str, cwd: pathlib.Path, env: dict, timeout: int = 600):
  return subprocess.run(['bash', '-c', command], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=timeout)


def _trained(workdir: str, command: str, cwd: pathlib.Path, env: dict, cache: pathlib.Path
             ) -> str:
  """Puts in cwd/workdir what `command` (run in cwd, training `workdir`) writes there.

  It runs once, in `cache` (laid out like cwd), and is copied from there after.
  Returns what it printed (stdout, then stderr).
  """
  output = cache / f'{workdir.replace("/", "_")}.output'
  if not (cache / workdir).exists():
    cache_env = {**env, 'TFDS_DATA_DIR': str(cache / 'tfds')}
    if 'cifar10' in command:
      _fake_cifar10(cache / 'tfds')
    setup = _run(command, cache, cache_env)
    assert setup.returncode == 0, setup.stderr
    output.write_text(setup.stdout + setup.stderr)
  shutil.rmtree(cwd / workdir, ignore_errors=True)  # What a failed download may have left.
  shutil.copytree(cache / workdir, cwd / workdir, symlinks=True)
  return output.read_text()


# Workdirs that many examples start from, and the configs that train them. Training one from
# scratch reads nothing but configs/, so the run is the same in any directory laid out like the
# repository: the documented training command itself (as the rules shrink it) runs once
# (`_trained`), and its workdir and output serve every source that documents it.
SHARED_RUNS = {'runs/digits': 'configs/vit_digits.py', 'runs/dates': 'configs/transformer_dates.py'}


def _shared_run_command(workdir: str) -> str:
  config = SHARED_RUNS[workdir]
  return _with_overrides(f'python -m vit_jax.main --config={config} --workdir={workdir}',
                         _rule(config).append)


def _prepare(command: str, cwd: pathlib.Path, env: dict, cache: pathlib.Path):
  """Generates the files `command` names that are not there yet."""
  def missing(name):
    return name in command and not (cwd / name).exists()

  if 'cifar10' in command:
    _fake_cifar10(pathlib.Path(env['TFDS_DATA_DIR']))
  if missing('path/to/ViT-B_16.npz'):
    _save_vit_npz(cwd / 'path/to/ViT-B_16.npz', **NARROW_FIELDS)
  if missing('ViT-B_16-224.npz'):
    _save_vit_npz(cwd / 'ViT-B_16-224.npz', image_size=32, **NARROW_FIELDS)
  if re.search(r'(^| )ViT-B_16\.npz', command) and missing('ViT-B_16.npz'):
    _save_vit_npz(cwd / 'ViT-B_16.npz')  # The real size: convert checks it against ViT-B_16.
  if missing('data/my_images'):
    _image_folder(cwd / 'data/my_images')
  if missing('data/train.en'):
    _corpus(cwd / 'data')
  if missing('photos/'):
    _images(cwd / 'photos', 3, '.jpg', size=(48, 40))
  if re.search(r'inputs=digits/', command) and missing('digits/'):
    _images(cwd / 'digits', 3, '.png', size=(8, 8), gray=True)
  for name in ('a.png', 'b.jpg'):
    if re.search(rf'\b{re.escape(name)}\b', command) and missing(name):
      _images(cwd, 1, name, size=(8, 8))
      (cwd / f'0{name}').rename(cwd / name)
  for workdir, config in SHARED_RUNS.items():
    trains_it = f'--config={config} --workdir={workdir}' in command
    if not trains_it and missing(workdir):
      _trained(workdir, _shared_run_command(workdir), cwd, env, cache)
  if missing('deit_small_distilled_patch16_224.safetensors'):
    _save_timm_deit_s(cwd / 'deit_small_distilled_patch16_224.safetensors')
  if ('--config.teacher=runs/teacher' in command  # A failed download may have left no weights.
      and not any((cwd / 'runs/teacher/checkpoints').glob('[0-9]*'))):
    _trained('runs/teacher', 'python -m vit_jax.main --config=configs/vit.py:ViT-testing,cifar10 '
             f'--workdir=runs/teacher {TINY_DIGITS} --config.data.image_size=32 '
             '--config.batch_size=8 --config.eval_batch_size=8', cwd, env, cache)


def _laid_out_like_the_repository(directory: pathlib.Path) -> pathlib.Path:
  (directory / 'configs').symlink_to(REPO / 'configs')
  (directory / 'tfds').mkdir()
  return directory


@pytest.fixture(scope='session')
def trained_runs(tmp_path_factory) -> pathlib.Path:
  """Where the workdirs that examples start from are trained, once (one worker runs this
  module: its xdist_group)."""
  return _laid_out_like_the_repository(tmp_path_factory.mktemp('trained_runs'))


@pytest.mark.parametrize('source', SOURCES)
def test_documented_commands_run_as_written(source, tmp_path, trained_runs, record_property):
  commands = SOURCES[source]
  assert commands, f'{source} documents no vit_jax command; drop it from the sources'
  _laid_out_like_the_repository(tmp_path)
  env = {**os.environ, 'TFDS_DATA_DIR': str(tmp_path / 'tfds'),
         'PATH': f'{os.path.dirname(sys.executable)}:{os.environ["PATH"]}'}
  exports = []
  for command in commands:
    if command.startswith('export '):
      exports.append(command)
      continue
    rule = _rule(command)
    _prepare(command, tmp_path, env, trained_runs)
    run_env = {**env, **OFFLINE} if rule.offline else env
    written = ' && '.join([*exports, _with_overrides(command, rule.append)])
    shared = next((workdir for workdir in SHARED_RUNS if written == _shared_run_command(workdir)
                   and not (tmp_path / workdir).exists()), None)
    if shared:  # The same command in the same state: the shared run, and its output.
      out = subprocess.CompletedProcess(written, 0, _trained(shared, written, tmp_path, env,
                                                             trained_runs), '')
    else:
      out = _run(written, tmp_path, run_env)
    output = out.stdout + out.stderr
    if rule.error:
      assert out.returncode != 0, (written, output)
      assert 'Traceback (most recent call last)' not in out.stderr, (written, out.stderr)
      last = out.stderr.rstrip('\n').rsplit('\n', 1)[-1]
      assert last.startswith('error: ') and re.search(rule.error, last), (written, out.stderr)
    else:
      assert out.returncode == 0, (written, output)
      assert 'Traceback (most recent call last)' not in output, (written, output)
      assert not NATIVE_WARNING.search(output), (written, output)  # TF's or XLA's C++ logs.
      assert re.search(rule.expect, output), (written, rule.expect, output)
  if source in CLIENT_SECTIONS:
    blocks = _python_blocks(source)
    assert blocks, f'{source} shows no client'
    for block in blocks:
      out = subprocess.run([sys.executable, '-c', block], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=300)
      assert out.returncode == 0, (block, out.stdout + out.stderr)
  record_property('commands', len([c for c in commands if not c.startswith('export ')]))


def test_every_source_is_searched():
  """The sources cover the README, every config docstring and every notebook."""
  assert {name.split(':')[0] for name in SOURCES} == (
      {'README.md'} | {f'configs/{p.name}' for p in (REPO / 'configs').glob('*.py')}
      | {f'colab/{p.name}' for p in (REPO / 'colab').glob('*.ipynb')})
  readme = sum(len(c) for name, c in SOURCES.items() if name.startswith('README.md'))
  blocks = re.findall(r'^```\n(.*?)^```', (REPO / 'README.md').read_text(), flags=re.S | re.M)
  mentioned = sum(len(COMMAND.findall(block)) for block in blocks)
  assert readme >= mentioned  # Every command of every shell block (and inline ones) is run.


def test_overrides_go_after_each_command():
  assert _with_overrides('echo "a | b" | python -m vit_jax.main --x=1', '--y=2') == (
      'echo "a | b" | python -m vit_jax.main --x=1 --y=2')
  assert _with_overrides('for i in 0 1; do python -m vit_jax.main --id=$i & done; wait',
                         '--y=2') == ('for i in 0 1; do python -m vit_jax.main --id=$i --y=2 '
                                      '& done; wait')
  assert _shell_lines('python3 -m venv .venv && . .venv/bin/activate && pip install -e . && '
                      'python -m vit_jax.main --a=1\n# a comment\npython -m vit_jax.x \\\n'
                      '    --b=2   # trailing\n') == ['python -m vit_jax.main --a=1',
                                                      'python -m vit_jax.x --b=2']
