"""The training losses the tasks share."""

import jax
import jax.numpy as jnp
import optax


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
  """Softmax cross-entropy per row of `logits` (..., C); `labels` are ids (...) or soft (..., C).

  With `label_smoothing` e, the target is (1 - e) * one_hot + e / C. Integer labels never
  build the (..., C) one-hot: the loss is logsumexp(z) - (1 - e) z[label] - e mean(z).
  """
  logits = logits.astype(jnp.float32)
  num_classes = logits.shape[-1]
  if labels.ndim == logits.ndim:  # Soft labels (e.g. mixup).
    if label_smoothing:
      labels = labels * (1.0 - label_smoothing) + label_smoothing / num_classes
    return optax.softmax_cross_entropy(logits, labels)
  log_normaliser = jax.nn.logsumexp(logits, axis=-1)
  label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  loss = log_normaliser - label_logit
  if label_smoothing:
    loss = loss + label_smoothing * (label_logit - jnp.mean(logits, axis=-1))
  return loss


def soft_distillation(student_logits: jax.Array, teacher_logits: jax.Array,
                      temperature: float) -> jax.Array:
  """tau^2 KL(softmax(teacher / tau) || softmax(student / tau)) per row (DeiT, eq. 2).

  As the DeiT paper writes it: summed over the classes, per example. (DeiT's code divides
  its batch sum by batch x classes, which is this divided by the number of classes.)
  """
  teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)
  return temperature**2 * kl
