"""The trainer's config: every knob with its default. configs/*.py start from here.

Every field can be set on the command line (`--config.FIELD=VALUE`): fields that may be
unset hold a typed placeholder (None until set), so they take a value of their type.
"""

import importlib.util
import os

import ml_collections
from ml_collections import config_dict

from vit_jax import errors, evaluation, models, progress
from vit_jax.data import images, text_config
from vit_jax.models import registry
from vit_jax.train import optim

TRAINERS = {'classification': ('train', 'evaluate', 'predict', 'visualize'),
            'translation': ('train', 'evaluate', 'translate', 'visualize')}


def model_config(name: str) -> ml_collections.ConfigDict:
  """Model `name` as a ConfigDict: every field of its module, with the registry's values.

  The fields are read off the module class (`vit_jax.models.registry.model_fields`), so
  they are the module's own (see its docstring and field comments); `dtype` is the compute
  dtype ('float32', or 'bfloat16' for bf16 compute with float32 parameters).
  """
  config = ml_collections.ConfigDict()
  config.name = name  # Registry entry; see `vit_jax.models.model_names()`.
  for field in registry.model_fields(name):
    config[field.name] = (config_dict.placeholder(field.type) if field.default is None
                          else field.default)
  return config


def model_and_dataset(arg: str, config_file: str) -> tuple[str, str]:
  """'MODEL,DATASET' (the argument of configs/vit.py and configs/deit.py) -> (model, dataset)."""
  model, _, dataset = arg.partition(',')
  if not model.strip() or not dataset.strip():
    raise errors.ConfigError(f"--config={config_file}:{arg}: expected MODEL,DATASET after the "
                             f"':', e.g. --config={config_file}:ViT-B_16,cifar10.")
  return model.strip(), dataset.strip()


def switch_model(config: ml_collections.ConfigDict, file_model: str, set_fields: list[str]):
  """After `--config.model.name` named another model than the config file's `file_model`:
  `config.model` becomes that model's registry entry, with the `set_fields` (the
  `--config.model.FIELD` overrides) as given; the file's sizes were another model's."""
  name = config.model.name
  if name == file_model:
    return
  switched = model_config(name)  # An unknown name: one line with the close ones.
  family = registry.model_family(name)
  if family != registry.model_family(file_model):
    raise errors.ConfigError(f'--config.model.name={name} is a {family} model, but the config '
                             f'is for {registry.model_family(file_model)} models ({file_model}); '
                             'use a config of its task.')
  for field in set_fields:
    if field not in switched:
      raise errors.ConfigError(f'--config.model.{field}: model {name} has no field {field!r}.')
    switched[field] = config.model[field]
  with config.unlocked():
    config.model = switched
  config.model.lock()


def describe_model(config: ml_collections.ConfigDict) -> str:
  """'ViT-Ti_16 with dropout_rate=0.1, remat=True': the name and the fields set otherwise."""
  registered = registry.model_config(config.name)
  changed = [f'{key}={config[key]!r}' for key in registered
             if key in config and config[key] != registered[key]]
  return config.name + (f' with {", ".join(changed)}' if changed else '')


def build_model(config: ml_collections.ConfigDict, **caller_fields):
  """The module that `config` (a `model_config`) describes; `caller_fields` add (or, taken from
  weights, replace) fields: num_classes, vocab_size, representation_size."""
  fields = {key: value for key, value in config.items() if key != 'name'}
  return models.get_model(config.name, **{**fields, **caller_fields})


def visualize_config() -> ml_collections.ConfigDict:
  """Knobs of `trainer=visualize`, which writes attention-map and training-curve PNGs."""
  config = ml_collections.ConfigDict()
  # Image files or URLs (classification) or sentences (translation), separated by '|';
  # '': the first `num_examples` test examples.
  config.inputs = ''
  config.num_examples = 4  # Test examples drawn when `inputs` is empty.
  config.layer = -1  # Layer whose attention is drawn (negative: counted from the last).
  config.output_dir = ''  # Where the PNGs go; '': WORKDIR/visualize.
  return config


def predict_config() -> ml_collections.ConfigDict:
  """Knobs of `trainer=predict`, which prints the top classes of image files."""
  config = ml_collections.ConfigDict()
  config.inputs = ''  # Image files, folders, globs or http(s) URLs, separated by ','.
  config.top_k = 5  # Classes printed per image.
  config.batch_size = 32  # Images per forward pass.
  config.output_file = ''  # Also write one JSON object per image here ('': print only).
  return config


def _common_config(task: str, model: str) -> ml_collections.ConfigDict:
  """The fields both tasks have."""
  config = ml_collections.ConfigDict()
  config.task = task  # What is trained: 'classification' (images) or 'translation' (text).
  config.trainer = 'train'  # What runs: one of TRAINERS[task].
  config.seed = 0  # Parameter init, dropout and data order.
  config.model = model_config(model)  # Registry name and every field of its module.
  config.accum_steps = 1  # Split each batch into this many microbatches (less memory).
  config.optimizer = optim.default_config()  # Optimizer and learning-rate schedule.
  # Devices on the mesh axes (data, fsdp, model); one -1 takes the remaining devices.
  # The batch is split over data x fsdp; params FSDP-split over fsdp, tensor-parallel over model.
  config.mesh_shape = (-1, 1, 1)
  config.fsdp_min_size = 4096  # Params with fewer elements are never FSDP-split.
  # CPU runs (ignored on accelerators), applied by `python -m vit_jax.main` at start-up:
  # glibc keeps freed memory in one arena for reuse, so XLA's per-step temporary buffers
  # stop page-faulting; the process does not give that memory back to the system.
  config.tune_malloc = True
  # Train steps (and batches of every evaluation) queued on the devices at once: 0 is 1 on CPUs
  # (where each queued one holds its own temporary buffers) and no limit on accelerators; N
  # waits for the one N back.
  config.steps_in_flight = 0
  # Where compiled programs are kept for later starts (evaluate, resume, ...): a directory,
  # 'off', or 'auto': $JAX_COMPILATION_CACHE_DIR, else on accelerators ~/.cache/vit_jax/xla
  # ($XDG_CACHE_HOME's), on CPUs none (see vit_jax.runtime.compilation_cache_dir).
  config.compilation_cache = 'auto'
  # Dense layers and attention on CPUs: 'auto' (with MKL installed and one device: both on
  # MKL on Intel CPUs, in float32, and in bfloat16 where the CPU has AMX; float32 attention
  # alone on AMD; else XLA), 'xla', or 'blas' (see vit_jax.kernels).
  config.matmul = 'auto'
  # Dropout's random masks: 'hash' (a counter hash, far cheaper than threefry on CPUs) or
  # 'jax' (jax.random.bernoulli, as plain Flax); see vit_jax.kernels.dropout.
  config.dropout_masks = 'hash'
  config.keep_checkpoints = 2  # Checkpoints kept in WORKDIR/checkpoints.
  # When WORKDIR's latest checkpoint cannot be read, evaluate, predict, translate, visualize
  # and a workdir as pretrained or teacher stop with an error; True takes the newest readable
  # one instead. (Training always resumes from the newest readable one.)
  config.checkpoint_fallback = False
  config.visualize = visualize_config()  # trainer=visualize: inputs, layer, output directory.
  # Keep an exponential moving average of the weights with this decay (e.g. 0.9999; 0: none),
  # checkpointed with the state and evaluated beside the weights ('ema_' figures).
  config.ema_decay = 0.0
  config.ema_warmup = True  # Decay min(ema_decay, (1 + step) / (10 + step)): early steps count.
  config.use_ema = False  # predict, translate, visualize: use the checkpoint's EMA weights.
  return config


def classification_config(model: str = 'ViT-B_16') -> ml_collections.ConfigDict:
  config = _common_config('classification', model)
  config.data = images.default_config()  # Dataset, preprocessing, augmentation.
  config.batch_size = 512  # Global training batch (all devices, all hosts).
  config.eval_batch_size = 512  # Global eval batch; the last partial batch is masked.
  config.total_steps = 10_000  # Optimizer updates.
  config.label_smoothing = 0.0  # Label smoothing of the cross-entropy targets.
  config.pretrained = ''  # Weights to start from: a published .npz or a vit_jax workdir.
  config.reinit_head = False  # Re-initialise the head even when the class count matches.
  config.teacher = ''  # DeiT: a teacher's vit_jax workdir or .npz (see `distillation`).
  # DeiT: the teacher's model name when `teacher` is a .npz (which sees the student's inputs; a
  # workdir teacher sees them normalized with its run's data.pixel_mean and pixel_std).
  config.teacher_model = ''
  # DeiT: the distillation token's target: 'none' (the labels, like the class token), 'hard'
  # (the teacher's top class, not smoothed) or 'soft' (the teacher's softened outputs).
  config.distillation = 'none'
  # DeiT: lambda in loss = (1 - lambda) class-token loss + lambda distillation-token loss.
  config.distillation_weight = 0.5
  config.distillation_temperature = 1.0  # 'soft': tau of both softmaxes; the KL is x tau^2.
  config.log_every = 50  # Steps between progress lines (and NaN checks).
  config.eval_every = 1000  # Steps between evaluations (0: only at the end).
  # Evaluations beside the test split, at each evaluation: a tuple of names from
  # vit_jax.evaluation.EVALS ('imagenet2012_real', 'imagenet_v2', 'imagenet_a', 'fewshot', ...).
  config.evals = ()
  config.fewshot = evaluation.fewshot_config()  # evals 'fewshot': dataset, splits, shots, l2.
  config.checkpoint_every = 1000  # Steps between checkpoints (0: only at the end).
  config.predict = predict_config()  # trainer=predict: image files, top-k, JSON output.
  return config


def translation_config(model: str = 'Transformer-base') -> ml_collections.ConfigDict:
  config = _common_config('translation', model)
  config.data = text_config.default_config()  # Corpus, tokenizer, lengths, packing.
  config.batch_size = 256  # Global training batch in (packed) rows.
  config.eval_batch_size = 256  # Global eval batch; the last partial batch is masked.
  config.total_steps = 100_000  # Optimizer updates.
  config.optimizer.name = 'adam'
  config.optimizer.b2 = 0.98  # The paper's Adam(0.9, 0.98, 1e-9).
  config.optimizer.eps = 1e-9
  config.optimizer.schedule = 'rsqrt'  # lr = peak * min(step / warmup, sqrt(warmup / step)).
  config.optimizer.warmup_steps = 4000
  config.optimizer.learning_rate = 512**-0.5 * 4000**-0.5  # d_model^-0.5 * warmup^-0.5 peak.
  config.label_smoothing = 0.1  # Label smoothing of the token cross-entropy.
  config.beam_size = 4  # Beam width for evaluation and translation (1: greedy).
  config.length_penalty_alpha = 0.6  # GNMT length penalty ((5 + len) / 6)^alpha.
  config.max_decode_length = 0  # Longest output in tokens (0: data.max_length).
  config.decode_batch_size = 64  # Sentences decoded at once (per process).
  config.num_eval_decode = 0  # Test sentences decoded for BLEU / exact match (0: all).
  config.input_file = ''  # trainer=translate: read sentences from this file, not stdin.
  config.log_every = 100  # Steps between progress lines (and NaN checks).
  config.eval_every = 5000  # Steps between evaluations (0: only at the end).
  config.checkpoint_every = 5000  # Steps between checkpoints (0: only at the end).
  return config


# The least value of each integer field (those a task has); run-time checks come later.
MINIMUMS = {
    'batch_size': 1, 'eval_batch_size': 1, 'total_steps': 0, 'accum_steps': 1, 'log_every': 1,
    'eval_every': 0, 'checkpoint_every': 0, 'keep_checkpoints': 1, 'fsdp_min_size': 0,
    'steps_in_flight': 0,
    'beam_size': 1, 'max_decode_length': 0, 'decode_batch_size': 1, 'num_eval_decode': 0,
    'visualize.num_examples': 1, 'predict.top_k': 1, 'predict.batch_size': 1,
    'seed': 0, 'optimizer.warmup_steps': 0, 'model.hidden_size': 1, 'model.embed_dim': 1,
    'model.mlp_dim': 1, 'model.num_heads': 1, 'model.num_layers': 0, 'model.max_length': 1,
    'model.representation_size': 1,
}
UNSET_ALLOWED = ('model.representation_size',)  # Integer fields that may be None (unset).
# Number fields that are rates or decays, in [0, 1) (1 would drop or keep everything).
FRACTIONS = ('label_smoothing', 'model.dropout_rate', 'model.attention_dropout_rate',
             'model.droppath_rate', 'optimizer.b1', 'optimizer.b2', 'optimizer.momentum')
# Number fields that no negative value makes sense for.
NON_NEGATIVE = ('optimizer.learning_rate', 'optimizer.end_learning_rate',
                'optimizer.weight_decay', 'optimizer.eps', 'optimizer.grad_clip_norm',
                'length_penalty_alpha', 'fewshot.l2_reg')
POSITIVE = ('model.resnet_width_factor',)  # Number fields that must be above 0.


def find_field(config: ml_collections.ConfigDict, name: str):
  """(True, value) of field 'a.b' of `config`, or (False, None) where the task has none."""
  section, _, key = name.rpartition('.')
  fields = config.get(section, {}) if section else config
  return (True, fields[key]) if key in fields else (False, None)


def check_ranges(config: ml_collections.ConfigDict):
  """One ConfigError naming every field out of its range (integers below `MINIMUMS`, numbers
  outside `FRACTIONS`' [0, 1), below 0 in `NON_NEGATIVE` or not above it in `POSITIVE`, a
  patch size that is not two sizes), so that a run stops at its start, not in a traceback or
  at the first evaluation it reaches, nor trains on quietly."""
  problems = []
  for name, least in MINIMUMS.items():
    present, value = find_field(config, name)
    if not present or (value is None and name in UNSET_ALLOWED):
      continue
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      unset = 'None or ' if name in UNSET_ALLOWED else ''
      problems.append(f'config.{name}={value!r} (expected {unset}an int >= {least})')
  present, patch = find_field(config, 'model.patch_size')
  if present and not (isinstance(patch, tuple) and len(patch) == 2 and all(
      isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in patch)):
    problems.append(f'config.model.patch_size={patch!r} (expected (height, width), ints >= 1)')
  for names, within, expected in ((FRACTIONS, lambda v: 0 <= v < 1, 'a number in [0, 1)'),
                                  (NON_NEGATIVE, lambda v: v >= 0, 'a number >= 0'),
                                  (POSITIVE, lambda v: v > 0, 'a number > 0')):
    for name in names:
      present, value = find_field(config, name)
      if present and (isinstance(value, bool) or not isinstance(value, (int, float))
                      or not within(value)):
        problems.append(f'config.{name}={value!r} (expected {expected})')
  if problems:
    raise errors.ConfigError(f'Invalid {", ".join(problems)}.')


def from_file(spec: str) -> ml_collections.ConfigDict:
  """The config of a config file, given as --config takes it: 'PATH[:ARGS]'."""
  path, *argument = spec.split(':', 1)
  if not os.path.isfile(path):
    raise errors.MissingFileError(f'The config file {path} does not exist.')
  module_spec = importlib.util.spec_from_file_location('vit_jax_config_file', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(*argument)


_TASK_CONFIGS = {'classification': classification_config, 'translation': translation_config}


def _merge(config: ml_collections.ConfigDict, saved: dict, path: str, unknown: list[str]):
  """Sets the fields of `config` that `saved` holds; JSON lists become tuples."""
  for key, value in saved.items():
    if key not in config:
      unknown.append(f'{path}{key}')
    elif isinstance(config[key], ml_collections.ConfigDict) and isinstance(value, dict):
      _merge(config[key], value, f'{path}{key}.', unknown)
    else:
      config[key] = tuple(value) if isinstance(value, list) else value


def from_saved(saved: dict, source: str) -> ml_collections.ConfigDict:
  """A config saved as JSON (WORKDIR/config.json), rebuilt on this version's defaults.

  So every field keeps its type (and can be overridden on the command line), and fields
  added since the run was saved take their defaults. Older names are carried over:
  `mixed_precision=True` became `model.dtype='bfloat16'`, `model.matmul` became `matmul`, the
  images' old default `data.shuffle_buffer=10000` became 0 (a new order each epoch), and a
  `teacher` without `distillation` means 'hard'.
  """
  saved = dict(saved)
  task = saved.get('task')
  model = saved.get('model', {}).get('name')
  if task not in _TASK_CONFIGS or not model:
    raise errors.BadFileError(f'{source} is not the config of a vit_jax run (task {task!r}, '
                              f'model {model!r}); pass --config=configs/FILE.py.')
  config = _TASK_CONFIGS[task](model)
  if saved.pop('mixed_precision', False):
    saved.setdefault('model', {})['dtype'] = 'bfloat16'
  if task == 'classification' and saved.get('teacher') and 'distillation' not in saved:
    saved['distillation'] = 'hard'  # Before 'distillation' existed, a teacher meant 'hard'.
  if task == 'classification' and saved.get('data', {}).get('shuffle_buffer') == 10_000:
    saved['data'] = {**saved['data'], 'shuffle_buffer': 0}  # The old default: a buffer.
  if 'matmul' in saved.get('model', {}):
    saved['model'] = dict(saved['model'])
    saved.setdefault('matmul', saved['model'].pop('matmul'))
  unknown = []
  _merge(config, saved, '', unknown)
  if unknown:
    progress.log(f'Note: {source} has fields this version does not know, left out: '
                 f'{", ".join(unknown)}.')
  return config
