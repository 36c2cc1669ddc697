"""Mixing examples within a training batch, in TensorFlow ops: mixup and CutMix.

mixup (Zhang et al., 2018): each example becomes w * itself + (1 - w) * its neighbour (the
example before it; the first takes the last), with one w ~ Beta(alpha, alpha) per batch.
CutMix (Yun et al., 2019): a box of each example is replaced by the same box of its neighbour.
The box's sides are sqrt(1 - w) of the image's, for one w ~ Beta(alpha, alpha) per batch, its
centre uniform over the image, clipped at the edges; w then becomes the share of pixels kept.
Either way the labels become soft: w on the example's class, 1 - w on its neighbour's.
With both on, each batch takes CutMix with probability `cutmix_prob`, else mixup (DeiT's
recipe: mixup 0.8, CutMix 1.0, half the batches each).
"""

from vit_jax.data.tf_cpu import tf


def _beta(seed, alpha: float):
  """One Beta(alpha, alpha) draw, float32."""
  gammas = tf.random.stateless_gamma([2], seed, alpha=alpha)
  # Beta(alpha, alpha) = G1 / (G1 + G2); for tiny alpha both can underflow to 0, then weight 0.
  return tf.math.divide_no_nan(gammas[0], gammas[0] + gammas[1])


def _mixed_labels(labels, num_classes: int, weight):
  """int (B,) labels -> float32 (B, num_classes): `weight` on each own class, the rest on its
  neighbour's."""
  one_hot = tf.one_hot(labels, num_classes, dtype=tf.float32)
  return weight * one_hot + (1.0 - weight) * tf.roll(one_hot, shift=1, axis=0)


def mixup(images, labels, num_classes: int, alpha: float, seed):
  """Mixes each example with its neighbour in the batch, with one Beta(alpha, alpha) weight.

  Args:
    images: float32 (B, H, W, C).
    labels: int (B,) class ids.
    num_classes: length of the soft-label vectors.
    alpha: Beta distribution parameter, > 0.
    seed: stateless seed, int32/int64 (2,).

  Returns:
    (mixed images float32 (B, H, W, C), soft labels float32 (B, num_classes), rows sum to 1).
  """
  weight = _beta(seed, alpha)
  mixed = weight * images + (1.0 - weight) * tf.roll(images, shift=1, axis=0)
  return mixed, _mixed_labels(labels, num_classes, weight)


def cutmix_box(height, width, weight, seed):
  """(top, bottom, left, right), int32, of the box that CutMix pastes: sides sqrt(1 - weight)
  of the image's around a uniform centre, clipped to the image (bottom, right exclusive)."""
  side = tf.sqrt(1.0 - weight)
  box_height = tf.cast(tf.cast(height, tf.float32) * side, tf.int32)
  box_width = tf.cast(tf.cast(width, tf.float32) * side, tf.int32)
  centre = tf.random.stateless_uniform([2], seed)
  centre_y = tf.cast(centre[0] * tf.cast(height, tf.float32), tf.int32)
  centre_x = tf.cast(centre[1] * tf.cast(width, tf.float32), tf.int32)
  top = tf.clip_by_value(centre_y - box_height // 2, 0, height)
  bottom = tf.clip_by_value(centre_y + box_height // 2, 0, height)
  left = tf.clip_by_value(centre_x - box_width // 2, 0, width)
  right = tf.clip_by_value(centre_x + box_width // 2, 0, width)
  return top, bottom, left, right


def cutmix(images, labels, num_classes: int, alpha: float, seed):
  """Pastes one box of each example's neighbour into it; arguments and returns as `mixup`."""
  weight_seed, box_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  height, width = tf.shape(images)[1], tf.shape(images)[2]
  top, bottom, left, right = cutmix_box(height, width, _beta(weight_seed, alpha), box_seed)
  rows, cols = tf.range(height), tf.range(width)
  inside = (((rows >= top) & (rows < bottom))[:, None]
            & ((cols >= left) & (cols < right))[None, :])  # (H, W)
  mixed = tf.where(inside[None, :, :, None], tf.roll(images, shift=1, axis=0), images)
  pasted = tf.cast((bottom - top) * (right - left), tf.float32)
  kept = 1.0 - pasted / tf.cast(height * width, tf.float32)
  return mixed, _mixed_labels(labels, num_classes, kept)


def mix(images, labels, num_classes: int, mixup_alpha: float, cutmix_alpha: float,
        cutmix_prob: float, seed):
  """mixup, CutMix, or with both alphas > 0 one of the two (CutMix with `cutmix_prob`)."""
  if cutmix_alpha <= 0:
    return mixup(images, labels, num_classes, mixup_alpha, seed)
  if mixup_alpha <= 0:
    return cutmix(images, labels, num_classes, cutmix_alpha, seed)
  choice_seed, mix_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  return tf.cond(tf.random.stateless_uniform([], choice_seed) < cutmix_prob,
                 lambda: cutmix(images, labels, num_classes, cutmix_alpha, mix_seed),
                 lambda: mixup(images, labels, num_classes, mixup_alpha, mix_seed))
