"""configs/ and the trainer's config: every field is reachable from the command line with its
type; model configs list every field of their module; the README's config knobs work."""

import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from helpers import user_error

from vit_jax import errors, models
from vit_jax.data import images, text_config
from vit_jax.models import registry
from vit_jax.train import config as config_lib
from vit_jax.train import optim

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / 'configs'
# Each run config with an argument its docstring uses.
RUN_CONFIGS = [('vit_digits.py', None), ('vit.py', 'ViT-S_16,data/my_images'),
               ('deit.py', 'DeiT-Ti_16,cifar10'), ('transformer_dates.py', None),
               ('transformer_text.py', None), ('transformer_wmt.py', None),
               ('transformer_small.py', None), ('vit_small_images.py', None)]
OVERRIDABLE = (int, float, bool, str, tuple)  # What ml_collections' config flags parse.


def load_config_module(filename):
  spec = importlib.util.spec_from_file_location(filename, CONFIGS / filename)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_config(filename, arg):
  module = load_config_module(filename)
  return module.get_config() if arg is None else module.get_config(arg)


def leaf_types(config: ml_collections.ConfigDict, prefix=''):
  for key in config.keys():
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict):
      yield from leaf_types(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', config.get_type(key)


@pytest.mark.parametrize('filename,arg', RUN_CONFIGS)
def test_every_field_has_a_type_the_command_line_parses(filename, arg):
  config = run_config(filename, arg)
  untyped = [(path, kind) for path, kind in leaf_types(config) if kind not in OVERRIDABLE]
  assert not untyped  # A None default without a placeholder type cannot be overridden.
  # The fields users set most, unset by default, keep their types.
  if config.task == 'translation':
    for field in ('train_files', 'eval_files', 'source_language', 'target_language',
                  'tfds_data_dir', 'tfds_manual_dir'):
      assert config.data.get_type(field) is str
    assert config.data.get_type('eval_max_length') is int
  else:
    assert config.data.get_type('tfds_data_dir') is str
    assert config.model.get_type('representation_size') is int
    assert config.model.get_type('resnet_layers') is tuple


@pytest.mark.parametrize('filename,arg', RUN_CONFIGS)
def test_run_configs_use_only_known_fields(filename, arg):
  config = run_config(filename, arg)
  defaults = (text_config.default_config() if config.task == 'translation'
              else images.default_config())
  assert set(config.data) == set(defaults)
  assert set(config.optimizer) == set(optim.default_config())
  required = {'vocab_size': 100} if config.task == 'translation' else {'num_classes': 10}
  config_lib.build_model(config.model, **required)
  if arg:
    assert config.data.dataset == arg.split(',')[1]


@pytest.mark.parametrize('name', models.model_names())
def test_model_config_lists_every_module_field(name):
  config = config_lib.model_config(name)
  module_cls = registry.MODELS[name][0]
  fields = {f.name for f in dataclasses.fields(module_cls)} - {'parent', 'name'}
  caller_set = {'num_classes', 'vocab_size', 'output_vocab_size', 'cached_decoding'}
  assert set(config) - {'name'} == fields - caller_set
  required = ({'vocab_size': 100} if name.startswith('Transformer') else {'num_classes': 10})
  # The config, as it is, builds exactly the registry's model.
  assert config_lib.build_model(config, **required) == models.get_model(name, **required)
  assert config.dtype == 'float32'


def test_the_compute_dtype_is_one_knob():
  config = config_lib.classification_config('ViT-testing')
  assert 'mixed_precision' not in config
  config.model.dtype = 'bfloat16'
  model = config_lib.build_model(config.model, num_classes=10)
  assert model.dtype == np.dtype('bfloat16') and model.param_dtype == np.dtype('float32')
  for name in ('bf16', 'int8'):  # Not a dtype; not a floating-point one (a JAX traceback before).
    config.model.dtype = name
    with pytest.raises(errors.ConfigError, match=f"dtype='{name}' is not a floating-point dtype"):
      config_lib.build_model(config.model, num_classes=10)


def test_a_saved_config_keeps_its_types_and_takes_new_defaults():
  config = config_lib.translation_config('Transformer-testing')
  config.data.train_files = 'a.en,a.de'
  saved = json.loads(config.to_json_best_effort())
  del saved['model']['norm_position']  # As if saved before the field existed.
  saved['mixed_precision'] = True  # The old name of model.dtype='bfloat16'.
  del saved['matmul']
  saved['model']['matmul'] = 'xla'  # Before the kernels left the models: model.matmul.
  restored = config_lib.from_saved(saved, 'config.json')
  assert restored.matmul == 'xla' and 'matmul' not in restored.model
  assert restored.data.train_files == 'a.en,a.de'
  assert restored.data.get_type('eval_files') is str and restored.data.eval_files is None
  assert restored.mesh_shape == (-1, 1, 1)  # JSON's list back to a tuple.
  assert restored.model.norm_position == 'post' and restored.model.dtype == 'bfloat16'
  with pytest.raises(errors.BadFileError, match='is not the config of a vit_jax run'):
    config_lib.from_saved({'task': 'x'}, 'config.json')


def test_a_saved_image_config_with_the_old_shuffle_buffer_default_takes_the_new_one():
  saved = json.loads(config_lib.classification_config('ViT-testing').to_json_best_effort())
  saved['data']['shuffle_buffer'] = 10_000  # The default before images were read by index.
  assert config_lib.from_saved(saved, 'config.json').data.shuffle_buffer == 0
  saved['data']['shuffle_buffer'] = 1
  assert config_lib.from_saved(saved, 'config.json').data.shuffle_buffer == 1


def _store_tfds_dataset(data_dir, name, num_examples=24, size=8):
  """A prepared TFDS dataset `name` (images and 3 labels) in data_dir."""
  tfds = pytest.importorskip('tensorflow_datasets')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)

  def split(n):
    return tf.data.Dataset.from_tensor_slices({
        'image': rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
        'label': rng.integers(0, 3, n)})

  tfds.dataset_builders.store_as_tfds_dataset(
      name=name, version='1.0.0', data_dir=str(data_dir),
      features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(shape=(size, size, 3)),
          'label': tfds.features.ClassLabel(names=['ant', 'bee', 'cat'])}),
      split_datasets={'train': split(num_examples), 'test': split(num_examples // 2)})


def _main(*args, cwd, timeout=300):
  return subprocess.run([sys.executable, '-m', 'vit_jax.main', *args], capture_output=True,
                        text=True, cwd=cwd, timeout=timeout)


TINY_IMAGES = ['--config.data.image_size=8', '--config.model.patch_size=(4, 4)',
               '--config.model.hidden_size=16', '--config.model.mlp_dim=32',
               '--config.model.num_heads=2', '--config.model.num_layers=1',
               '--config.batch_size=8', '--config.eval_batch_size=8', '--config.total_steps=2',
               '--config.log_every=1', '--config.eval_every=0', '--config.checkpoint_every=0']


def test_tfds_data_dir_from_the_command_line_reaches_tfds(tmp_path):
  _store_tfds_dataset(tmp_path / 'tfds', 'my_shapes')
  out = _main('--config=configs/vit.py:ViT-Ti_16,my_shapes', f'--workdir={tmp_path}/run',
              f'--config.data.tfds_data_dir={tmp_path}/tfds', '--config.data.train_split=train',
              *TINY_IMAGES, cwd=REPO)
  assert out.returncode == 0, out.stderr
  assert 'eval at step 2' in out.stdout and 'num_examples 12\n' in out.stdout
  saved = json.loads((tmp_path / 'run' / 'config.json').read_text())
  assert saved['data']['tfds_data_dir'] == f'{tmp_path}/tfds'
  assert json.loads((tmp_path / 'run' / 'class_names.json').read_text()) == ['ant', 'bee', 'cat']
  # Without the directory TFDS does not find it: the option is what reached TFDS.
  out = _main('--config=configs/vit.py:ViT-Ti_16,my_shapes', f'--workdir={tmp_path}/other',
              *TINY_IMAGES, cwd=REPO)
  assert out.returncode == 1
  assert user_error(out.stderr).startswith("error: Unknown dataset 'my_shapes'")


def test_from_file_reads_a_config_file_as_the_command_line_does():
  """What the notebooks start from: configs/*.py, with the argument after ':'."""
  digits = config_lib.from_file(str(CONFIGS / 'vit_digits.py'))
  assert digits.data.dataset == 'digits' and digits.model.hidden_size == 64
  vit = config_lib.from_file(f'{CONFIGS / "vit.py"}:ViT-S_16,cifar10')
  assert vit.model.name == 'ViT-S_16' and vit.data.dataset == 'cifar10'
  with pytest.raises(errors.MissingFileError, match='The config file .*nope.py does not exist'):
    config_lib.from_file(str(CONFIGS / 'nope.py'))


def test_integer_fields_out_of_range_stop_the_run_at_its_start(tmp_path):
  """Decoding settings are used only at the first evaluation: they are checked before training."""
  workdir = tmp_path / 'run'
  out = subprocess.run([sys.executable, '-m', 'vit_jax.main', '--config=configs/transformer_dates.py',
                        f'--workdir={workdir}', '--config.beam_size=0', '--config.log_every=0',
                        '--config.visualize.num_examples=-1'],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert user_error(out.stderr) == (
      'error: Invalid config.log_every=0 (expected an int >= 1), config.beam_size=0 (expected '
      'an int >= 1), config.visualize.num_examples=-1 (expected an int >= 1).')
  assert not workdir.exists()


@pytest.mark.parametrize('task', ['classification', 'translation'])
def test_the_range_table_names_fields_of_the_configs(task):
  config = (config_lib.classification_config() if task == 'classification'
            else config_lib.translation_config())
  config_lib.check_ranges(config)  # The defaults are in range.
  for name in config_lib.MINIMUMS:
    section, _, key = name.rpartition('.')
    fields = config.get(section, {}) if section else config
    if key in fields:
      assert isinstance(fields[key], int) or name in config_lib.UNSET_ALLOWED, name


def test_every_name_in_the_range_tables_is_a_field_of_a_task():
  """A misspelt name would be skipped as a field the task lacks, its range never checked."""
  configs = (config_lib.classification_config('ViT-B_16'),
             config_lib.classification_config('R50+ViT-B_16'),
             config_lib.translation_config())
  for name in (*config_lib.MINIMUMS, *config_lib.FRACTIONS, *config_lib.NON_NEGATIVE,
               *config_lib.POSITIVE, 'model.patch_size'):
    section, _, key = name.rpartition('.')
    assert any(key in (c.get(section, {}) if section else c) for c in configs), name


def test_rates_and_learning_rates_out_of_range_stop_the_run_at_its_start(tmp_path):
  """Before, a dropout rate of 1.5 or a negative seed ended in a traceback, and a negative
  learning rate, weight decay or warmup trained on quietly."""
  workdir = tmp_path / 'run'
  out = subprocess.run([sys.executable, '-m', 'vit_jax.main', '--config=configs/vit_digits.py',
                        f'--workdir={workdir}', '--config.model.dropout_rate=1.5', '--config.seed=-1',
                        '--config.optimizer.learning_rate=-1', '--config.optimizer.b2=1.0',
                        '--config.optimizer.warmup_steps=-5', '--config.label_smoothing=0.2'],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert user_error(out.stderr) == (
      'error: Invalid config.seed=-1 (expected an int >= 0), '
      'config.optimizer.warmup_steps=-5 (expected an int >= 0), '
      'config.model.dropout_rate=1.5 (expected a number in [0, 1)), config.optimizer.b2=1.0 '
      '(expected a number in [0, 1)), config.optimizer.learning_rate=-1.0 (expected a number '
      '>= 0).')
  assert not workdir.exists()


def test_model_sizes_out_of_range_stop_the_run_at_its_start(tmp_path):
  """Before, each of these ended in a traceback from JAX or Flax."""
  workdir = tmp_path / 'run'
  out = subprocess.run([sys.executable, '-m', 'vit_jax.main', '--config=configs/vit_digits.py',
                        f'--workdir={workdir}', '--config.model.hidden_size=0',
                        '--config.model.num_heads=0', '--config.model.representation_size=-4',
                        '--config.model.patch_size=(2,)'],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert user_error(out.stderr) == (
      'error: Invalid config.model.hidden_size=0 (expected an int >= 1), config.model.num_heads=0 '
      '(expected an int >= 1), config.model.representation_size=-4 (expected None or an int >= '
      '1), config.model.patch_size=(2,) (expected (height, width), ints >= 1).')
  assert not workdir.exists()


def test_naming_another_model_on_the_command_line_takes_its_registry_sizes():
  """Before, `--config.model.name=ViT-Ti_16` on the digits config gave a model named ViT-Ti_16
  with the digits model's sizes (64 wide, 4 layers, 2x2 patches)."""
  from vit_jax.train import flag_errors  # pylint: disable=g-import-not-at-top
  spec = f'--config={REPO}/configs/vit_digits.py'
  config = config_lib.from_file(spec.split('=', 1)[1])
  config.model.name, config.model.num_layers = 'ViT-Ti_16', 1  # As the flags set them.
  flag_errors.switch_model_if_named(
      config, ['main', spec, '--config.model.name=ViT-Ti_16', '--config.model.num_layers=1'], '')
  expected = dict(registry.model_config('ViT-Ti_16'), num_layers=1)
  assert {key: config.model[key] for key in expected} == expected
  assert config.data.image_size == 8  # The rest of the config stays the file's.
  # The file's own model named again: its fields stay as the file set them.
  config = config_lib.from_file(spec.split('=', 1)[1])
  flag_errors.switch_model_if_named(config, ['main', spec, '--config.model.name=ViT-testing'], '')
  assert config.model.hidden_size == 64 and config.model.patch_size == (2, 2)
  # A model of the other task, or an override of a field the new model lacks: one line each.
  config.model.name = 'Transformer-base'
  with pytest.raises(errors.ConfigError, match=r'is a Transformer model, but the config is for '
                                               r'VisionTransformer models \(ViT-testing\)'):
    flag_errors.switch_model_if_named(config, ['main', spec, '--config.model.name=x'], '')
  config.model.name = 'ViT-S_16'
  with pytest.raises(errors.ConfigError, match=r"model ViT-S_16 has no field 'resnet_stages'"):
    flag_errors.switch_model_if_named(
        config, ['main', spec, '--config.model.name=x', '--config.model.resnet_stages=2'], '')
