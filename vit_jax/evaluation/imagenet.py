"""ImageNet variants scored with a 1,000-class ImageNet model: ReaL, v2, Sketch, A and R.

  imagenet2012_real  'validation'  ReaL accuracy: the top-1 class counts as right when it is one
                                   of the image's ReaL labels; images with none are not counted.
  imagenet_v2        'test'        top-1 accuracy over the 1,000 classes.
  imagenet_sketch    'test'        top-1 accuracy over the 1,000 classes.
  imagenet_a         'test'        top-1 accuracy over the split's 200 classes.
  imagenet_r         'test'        top-1 accuracy over the split's 200 classes.

ImageNet-A and -R: TFDS's 'label' ClassLabel holds the 1,000 ImageNet names (their builders declare
no 200-class list), so labels are already 1000-class ids, of which 200 occur. The subset is the
classes that occur in the split: its labels are read once, images not decoded, at the first
evaluation and kept; the prediction is the argmax over logits[:, subset], as a 1000-class id.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.data import eval_sets
from vit_jax.evaluation import common
from vit_jax.train import mesh as mesh_lib

NUM_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class Variant:
  """A TFDS ImageNet variant, the split read and how predictions are scored."""
  name: str
  split: str
  scoring: str  # 'real': ReaL labels; 'all': top-1 of 1,000; 'subset': top-1 of those in the split.


VARIANTS = {variant.name: variant for variant in (
    Variant('imagenet2012_real', 'validation', 'real'),
    Variant('imagenet_v2', 'test', 'all'),
    Variant('imagenet_sketch', 'test', 'all'),
    Variant('imagenet_a', 'test', 'subset'),
    Variant('imagenet_r', 'test', 'subset'),
)}


@jax.jit
def _top1_sums(logits, labels, mask, classes):
  """Right predictions among `classes` (int32 (K,) class ids) and examples, over a batch."""
  predicted = classes[jnp.argmax(logits[:, classes], axis=-1)]
  return {'correct': jnp.sum((predicted == labels) * mask), 'count': jnp.sum(mask)}


@jax.jit
def _real_sums(logits, real_labels, mask):
  """Top-1 predictions in the ReaL set (bool (B, 1000)), among images whose set is not empty."""
  predicted = jnp.argmax(logits, axis=-1)
  hit = jnp.take_along_axis(real_labels, predicted[:, None], axis=1)[:, 0]
  counted = mask * jnp.any(real_labels, axis=-1)
  return {'correct': jnp.sum(hit * counted), 'count': jnp.sum(counted)}


def _label(example):
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  return {'label': tf.cast(example['label'], tf.int32)}


def _real_labels(example):
  """The ReaL label ids (a variable-length list) as a multi-hot bool (1000,)."""
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  return {'real_labels': tf.reduce_any(tf.one_hot(example['real_label'], NUM_CLASSES) > 0, axis=0)}


class ImageNetEvaluator(common.Evaluator):
  """Accuracy of the model's 1,000 logits on one ImageNet variant (see the module docstring)."""

  def __init__(self, variant: Variant, data_config: ml_collections.ConfigDict, process_index: int,
               process_count: int):
    self.variant = variant
    self.name = variant.name
    self.metric_names = (f'{variant.name}_accuracy',)
    real = variant.scoring == 'real'
    self.split = eval_sets.open_split(
        variant.name, variant.split, data_config, _real_labels if real else _label,
        ('real_label',) if real else ('label',), process_index, process_count)
    self._subset = None  # 'subset' scoring: the class ids in the split, read at first use.

  def __repr__(self):
    return f'ImageNetEvaluator({self.split!r}, scoring={self.variant.scoring!r})'

  def classes(self) -> np.ndarray:
    """int32 class ids the prediction is chosen among: all 1,000, or those in the split."""
    if self.variant.scoring != 'subset':
      return np.arange(NUM_CLASSES, dtype=np.int32)
    if self._subset is None:
      self._subset = self.split.labels_present('label').astype(np.int32)
    return self._subset

  def evaluate(self, logits_fn, features_fn, mesh, batch_size, in_flight=None):
    del features_fn
    num_batches = self.split.num_batches(batch_size)
    batches = common.global_batches(self.split.batches(batch_size), num_batches, mesh,
                                    f'Evaluating on {self.name} {self.split.split}')
    if self.variant.scoring == 'real':
      def batch_sums(batch):
        return _real_sums(logits_fn(batch['image']), batch['real_labels'], batch['mask'])
    else:
      classes = mesh_lib.from_host(self.classes(), mesh_lib.replicated(mesh))
      def batch_sums(batch):
        return _top1_sums(logits_fn(batch['image']), batch['label'], batch['mask'], classes)
    totals = common.summed(batches, batch_sums, in_flight)
    return {self.metric_names[0]: common.ratio(totals['correct'], totals['count'])}
