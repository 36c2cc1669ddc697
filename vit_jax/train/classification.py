"""Image classification: ViT / hybrid / DeiT on digits, TFDS or image folders.

Plugs into the shared loop (`vit_jax.train.loop`) as a `Task`.
"""

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import errors, evaluation, files, progress, weights
from vit_jax.data import class_names, images, normalization
from vit_jax.train import checkpointing, config as config_lib, losses, run_config, task
from vit_jax.train.losses import cross_entropy

DISTILLATIONS = ('none', 'hard', 'soft')
# The heads whose logits a DeiT's evaluation reports beside their mean (metric names).
_DEIT_HEADS = {'head': 'class_head', 'head_dist': 'distillation_head'}


def read_weights(path: str, role: str = 'config.pretrained', fall_back: bool = False) -> dict:
  """The params stored at `path`: a published .npz (any filesystem) or a classification workdir.

  `role` names the config field in errors (config.pretrained, config.teacher); `fall_back`
  takes a workdir's newest readable checkpoint when its latest cannot be read.
  """
  if files.isdir(path):
    run_config.check_task(path, 'classification', role)
    return checkpointing.restore_params(path, fall_back)[0]
  if path.endswith('.npz') or files.is_remote(path):
    return weights.load_npz(path)
  hint = (f' Convert a timm file first: python -m vit_jax.convert {path} '
          f'{path.removesuffix(".safetensors")}.npz --model NAME.'
          if path.endswith('.safetensors') else '')
  raise errors.ConfigError(f'Cannot load weights from {role}={path!r}: expected a .npz '
                           f'checkpoint or the workdir of a vit_jax run.{hint}')


def load_weights(path: str, init_params: Any, reinit_head: bool = False,
                 role: str = 'config.pretrained', fall_back: bool = False,
                 init_values=None) -> Any:
  """Weights from a published .npz or a vit_jax workdir, fitted to `init_params` on the host.

  `init_params` may be shapes only; `init_values` then gives what comes from the model (see
  `weights.load_pretrained`).
  """
  return weights.load_pretrained(read_weights(path, role, fall_back), init_params,
                                 reinit_head=reinit_head, source_name=path,
                                 init_values=init_values)


def _check_teacher_exists(path: str):
  """A local config.teacher that is not there is an error (a remote one: reading it says)."""
  if not files.is_remote(path) and not files.exists(path):
    raise errors.MissingFileError(
        f'Teacher {path!r} (config.teacher) does not exist: train the teacher there first, '
        'or set config.teacher to a trained workdir or a .npz weights file.')


class ClassificationTask(task.BatchedTask):
  """Model, data, loss and metrics of image classification."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    # Before the data: preparing a TFDS dataset can take minutes, these checks no time.
    self.distilled = config.model.classifier == 'token_distill'  # The model's own field.
    check_distillation(config, self.distilled)
    if config.teacher:
      _check_teacher_exists(config.teacher)
    super().__init__(config, images.build(config.data))
    self.model = config_lib.build_model(config.model, num_classes=self.data.num_classes)
    self.teacher = None
    self._teacher_params = None
    self._teacher_inputs = None  # (scale, offset): the student's inputs -> the teacher's.
    if config.teacher:
      self.teacher, self._teacher_params = self._load_teacher(config.teacher)
    names = evaluation.names_of(config.evals)
    if 'fewshot' not in names and config.fewshot.to_dict() != evaluation.fewshot_config().to_dict():
      raise errors.ConfigError(f'config.fewshot is set but config.evals={tuple(names)} has no '
                               "'fewshot': add it (--config.evals=fewshot), or leave "
                               'config.fewshot as it is.')
    self.evaluators = evaluation.build(names, config.data, config.fewshot, self.data.num_classes)
    features = self.model.clone(num_classes=0)  # Pooled pre-logits features.
    self._logits = jax.jit(lambda params, images: self.model.apply({'params': params}, images))
    self._features = jax.jit(lambda params, images: features.apply({'params': params}, images))
    if self.data.class_names:
      class_names.check_learnt(workdir, self.data.class_names, config.data.dataset)
      # Saved by training (for trainer=predict), last, once the config has passed every check
      # here: a mistake leaves a new workdir empty. The other modes only read the workdir.
      if config.trainer == 'train' and jax.process_index() == 0:
        class_names.save(workdir, self.data.class_names)

  def _dummy_images(self):
    return jnp.zeros((1, *self.data.image_shape), jnp.float32)

  def _load_teacher(self, path: str):
    if files.isdir(path):
      run_config.check_task(path, 'classification', 'config.teacher')
      if self.data.class_names:
        class_names.check_learnt(path, self.data.class_names, self.config.data.dataset,
                                 teacher=True)
      teacher_config = run_config.load_config(path)
      model_config = teacher_config.model
      self._teacher_inputs = _renormalization(self.config.data, teacher_config.data, path)
    else:
      if not self.config.get('teacher_model'):
        raise errors.ConfigError(f'Teacher {path!r} is a weights file: set config.teacher_model to '
                                 'its model name (e.g. ViT-B_16).')
      model_config = config_lib.model_config(self.config.teacher_model)
    teacher = config_lib.build_model(model_config, num_classes=self.data.num_classes)
    init = jax.eval_shape(lambda: teacher.init(jax.random.PRNGKey(0), self._dummy_images()))
    params = load_weights(path, init['params'], role='config.teacher',
                          fall_back=self.config.checkpoint_fallback)
    progress.log(f'Distilling from teacher {model_config.name} at {path}.')
    return teacher, params

  # --- Task interface -------------------------------------------------------

  def init_params(self, rng):
    return self.model.init(rng, self._dummy_images())['params']

  def initial_params(self, rng, abstract_params):
    """The pretrained weights (host numpy) fitted to the model, or None without any.

    Fitted to the shapes `abstract_params`; what comes from the model (a re-initialised
    head) is `init_params(rng)`'s, computed for those params only on this process's first
    device.
    """
    if not self.config.get('pretrained'):
      return None
    progress.log(f'Loading pretrained weights from {self.config.pretrained}.')

    def fresh(names):
      def pick(rng):
        flat = weights.flatten_params(self.init_params(rng))
        return {name: flat[name] for name in names}
      return jax.device_get(jax.jit(pick)(jax.device_put(rng, jax.local_devices()[0])))
    return load_weights(self.config.pretrained, abstract_params,
                        reinit_head=self.config.reinit_head,
                        fall_back=self.config.checkpoint_fallback, init_values=fresh)

  def frozen_params(self):
    return self._teacher_params

  def loss(self, params, batch, rng, frozen):
    output = self.model.apply({'params': params}, batch['image'], train=True,
                              rngs={'dropout': rng})
    if not self.distilled:
      return jnp.mean(cross_entropy(output, batch['label'], self.config.label_smoothing)), {}
    logits, logits_dist = output
    class_loss = jnp.mean(cross_entropy(logits, batch['label'], self.config.label_smoothing))
    dist_loss = jnp.mean(self._distillation_loss(logits_dist, batch, frozen))
    weight = self.config.distillation_weight
    return ((1 - weight) * class_loss + weight * dist_loss,
            {'class_loss': class_loss, 'dist_loss': dist_loss})

  def _distillation_loss(self, logits_dist, batch, frozen):
    """Per example: the distillation token's loss against its target (`config.distillation`)."""
    if self.config.distillation == 'none':  # The labels, as for the class token.
      return cross_entropy(logits_dist, batch['label'], self.config.label_smoothing)
    teacher_images = batch['image']
    if self._teacher_inputs is not None:
      scale, offset = self._teacher_inputs
      teacher_images = teacher_images * scale + offset
    teacher_logits = jax.lax.stop_gradient(self.teacher.apply({'params': frozen}, teacher_images))
    if self.config.distillation == 'hard':  # The teacher's top class, not smoothed (DeiT).
      return cross_entropy(logits_dist, jnp.argmax(teacher_logits, axis=-1))
    return losses.soft_distillation(logits_dist, teacher_logits,
                                    self.config.distillation_temperature)

  def _eval_logits(self, params, images) -> tuple[jax.Array, dict]:
    """The model's logits and, for a DeiT, each head's (metric name -> logits)."""
    if not self.distilled:
      return self.model.apply({'params': params}, images), {}
    logits, state = self.model.apply(
        {'params': params}, images,
        capture_intermediates=lambda module, _: module.name in _DEIT_HEADS)
    captured = state['intermediates']
    return logits, {name: captured[head]['__call__'][0].astype(jnp.float32)
                    for head, name in _DEIT_HEADS.items()}

  def eval_sums(self, params, batch):
    logits, heads = self._eval_logits(params, batch['image'])
    mask = batch['mask']

    def correct(head_logits):
      return jnp.sum((jnp.argmax(head_logits, -1) == batch['label']) * mask)
    return {'loss': jnp.sum(cross_entropy(logits, batch['label']) * mask),
            'correct': correct(logits), 'count': jnp.sum(mask),
            **{f'correct_{name}': correct(head_logits) for name, head_logits in heads.items()}}

  def eval_summary(self, sums):
    """Accuracy (a DeiT's: of its heads' mean, as DeiT reports), loss, examples; heads'."""
    count = float(sums['count'])
    heads = {f'{key[len("correct_"):]}_accuracy': float(value) / count
             for key, value in sums.items() if key.startswith('correct_')}
    return {'accuracy': float(sums['correct']) / count, 'loss': float(sums['loss']) / count,
            'num_examples': count, **heads}

  def extra_eval(self, params, mesh, in_flight=None) -> dict:
    """The figures of `config.evals` (other datasets, few-shot probes)."""
    if not self.evaluators:
      return {}
    return evaluation.run(self.evaluators, lambda images: self._logits(params, images),
                          lambda images: self._features(params, images), mesh,
                          self.local_eval_batch_size, in_flight=in_flight)



def _renormalization(student_data, teacher_data, teacher_path: str):
  """(scale, offset) taking the student's normalized inputs to the teacher's pixel statistics
  (its run's config.data.pixel_mean/pixel_std); None when they are the same."""
  scale, offset = normalization.of_config(student_data)
  teacher_scale, teacher_offset = normalization.affine(
      teacher_data.pixel_mean, teacher_data.pixel_std, student_data.channels,
      where=f'{teacher_path}/config.json: data.')
  if np.array_equal(scale, teacher_scale) and np.array_equal(offset, teacher_offset):
    return None
  # pixel = (x - offset) / scale, so the teacher's x' = pixel * teacher_scale + teacher_offset.
  ratio = teacher_scale / scale
  return ratio, teacher_offset - offset * ratio


def check_distillation(config: ml_collections.ConfigDict, distilled: bool):
  """One-line errors for distillation settings that do not fit together or the model."""
  mode, weight = config.distillation, config.distillation_weight
  temperature = config.distillation_temperature
  if mode not in DISTILLATIONS:
    raise errors.ConfigError(f'Unknown config.distillation={mode!r}; choose one of '
                             f'{DISTILLATIONS}.')
  if not distilled:
    set_fields = [name for name, is_set in (
        ('config.teacher', bool(config.teacher)), ('config.distillation', mode != 'none'),
        ('config.distillation_weight', weight != 0.5),
        ('config.distillation_temperature', temperature != 1.0)) if is_set]
    if set_fields:
      raise errors.ConfigError(f'{", ".join(set_fields)} is set but model {config.model.name} '
                               "has no distillation head; use a DeiT model "
                               "(classifier='token_distill').")
    return
  if config.teacher and mode == 'none':
    raise errors.ConfigError(f"config.teacher={config.teacher!r} is set but "
                             "config.distillation='none' trains the distillation token on the "
                             "labels: set --config.distillation=hard (DeiT's choice) or soft.")
  if mode != 'none' and not config.teacher:
    raise errors.ConfigError(f'config.distillation={mode!r} needs a teacher: set '
                             '--config.teacher to its workdir or .npz.')
  if not 0 <= weight <= 1:
    raise errors.ConfigError(f'config.distillation_weight={weight} must be in [0, 1] (the '
                             "distillation token's share of the loss).")
  if temperature <= 0:
    raise errors.ConfigError(f'config.distillation_temperature={temperature} must be > 0.')
  if temperature != 1.0 and mode != 'soft':
    raise errors.ConfigError(f'config.distillation_temperature={temperature} applies to '
                             f"distillation='soft' only, but it is {mode!r}: leave it at 1.")
