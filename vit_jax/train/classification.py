"""Image classification: ViT / hybrid / DeiT on digits, TFDS or image folders.

Plugs into the shared loop (`vit_jax.train.loop`) as a `Task`.
"""

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import errors, files, progress, weights
from vit_jax.data import class_names, images
from vit_jax.train import checkpointing, config as config_lib, task
from vit_jax.train.losses import cross_entropy


def read_weights(path: str, role: str = 'config.pretrained', fall_back: bool = False) -> dict:
  """The params stored at `path`: a published .npz (any filesystem) or a classification workdir.

  `role` names the config field in errors (config.pretrained, config.teacher); `fall_back`
  takes a workdir's newest readable checkpoint when its latest cannot be read.
  """
  if files.isdir(path):
    checkpointing.check_task(path, 'classification', role)
    return checkpointing.restore_params(path, fall_back)[0]
  if path.endswith('.npz') or files.is_remote(path):
    return weights.load_npz(path)
  raise errors.ConfigError(f'Cannot load weights from {role}={path!r}: expected a .npz '
                           'checkpoint or the workdir of a vit_jax run.')


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


class ClassificationTask(task.BatchedTask):
  """Model, data, loss and metrics of image classification."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    super().__init__(config, images.build(config.data))
    if self.data.class_names and jax.process_index() == 0:
      class_names.save(workdir, self.data.class_names)  # For trainer=predict.
    self.model = config_lib.build_model(config.model, num_classes=self.data.num_classes)
    self.distilled = self.model.classifier == 'token_distill'
    self.teacher = None
    self._teacher_params = None
    if config.get('teacher'):
      if not self.distilled:
        raise errors.ConfigError(f"config.teacher is set but model {config.model.name} has no "
                                 "distillation head; use a DeiT model "
                                 "(classifier='token_distill').")
      self.teacher, self._teacher_params = self._load_teacher(config.teacher)

  def _dummy_images(self):
    return jnp.zeros((1, *self.data.image_shape), jnp.float32)

  def _load_teacher(self, path: str):
    if files.isdir(path):
      checkpointing.check_task(path, 'classification', 'config.teacher')
      teacher_config = checkpointing.load_config(path)
      model_config = teacher_config.model
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
    smoothing = self.config.label_smoothing
    if not self.distilled:
      return jnp.mean(cross_entropy(output, batch['label'], smoothing)), {}
    logits, logits_dist = output
    if self.teacher is None:
      dist_labels = batch['label']
    else:  # Hard distillation: the teacher's top class is the distillation label.
      teacher_logits = self.teacher.apply({'params': frozen}, batch['image'])
      dist_labels = jnp.argmax(jax.lax.stop_gradient(teacher_logits), axis=-1)
    class_loss = jnp.mean(cross_entropy(logits, batch['label'], smoothing))
    dist_loss = jnp.mean(cross_entropy(logits_dist, dist_labels, smoothing))
    return (class_loss + dist_loss) / 2, {'class_loss': class_loss, 'dist_loss': dist_loss}

  def eval_sums(self, params, batch):
    logits = self.model.apply({'params': params}, batch['image'])
    mask = batch['mask']
    return {'loss': jnp.sum(cross_entropy(logits, batch['label']) * mask),
            'correct': jnp.sum((jnp.argmax(logits, -1) == batch['label']) * mask),
            'count': jnp.sum(mask)}

  def eval_summary(self, sums):
    count = float(sums['count'])
    return {'accuracy': float(sums['correct']) / count, 'loss': float(sums['loss']) / count,
            'num_examples': count}

  def extra_eval(self, params) -> dict:
    del params
    return {}

