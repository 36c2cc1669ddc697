"""The training losses the tasks share."""

import functools

import jax
import jax.numpy as jnp
import optax


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
  """Softmax cross-entropy per row of `logits` (..., C); `labels` are ids (...) or soft (..., C).

  With `label_smoothing` e, the target is (1 - e) * one_hot + e / C. Integer labels never
  build the (..., C) one-hot: the loss is logsumexp(z) - (1 - e) z[label] - e mean(z), and
  its gradient softmax(z) - target is one elementwise pass over the logits (`_label_loss`).
  """
  if labels.ndim == logits.ndim:  # Soft labels (e.g. mixup).
    logits = logits.astype(jnp.float32)
    if label_smoothing:
      labels = labels * (1.0 - label_smoothing) + label_smoothing / logits.shape[-1]
    return optax.softmax_cross_entropy(logits, labels)
  return _label_loss(logits, labels.astype(jnp.int32), float(label_smoothing))


def _label_loss_and_normaliser(logits, labels, label_smoothing):
  logits = logits.astype(jnp.float32)
  log_normaliser = jax.nn.logsumexp(logits, axis=-1)
  label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  loss = log_normaliser - label_logit
  if label_smoothing:
    loss = loss + label_smoothing * (label_logit - jnp.mean(logits, axis=-1))
  return loss, log_normaliser


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _label_loss(logits: jax.Array, labels: jax.Array, label_smoothing: float) -> jax.Array:
  """Cross-entropy against integer labels, with its gradient written out: JAX's own
  gradient of the label's logit scatters into a float32 (..., C) array of zeros (on GPUs,
  the largest memory traffic of a Transformer-base step with a 32,000-token vocabulary)."""
  return _label_loss_and_normaliser(logits, labels, label_smoothing)[0]


def _label_loss_forward(logits, labels, label_smoothing):
  loss, log_normaliser = _label_loss_and_normaliser(logits, labels, label_smoothing)
  return loss, (logits, labels, log_normaliser)


def _label_loss_backward(label_smoothing, residuals, loss_cotangent):
  logits, labels, log_normaliser = residuals
  num_classes = logits.shape[-1]
  probabilities = jnp.exp(logits.astype(jnp.float32) - log_normaliser[..., None])
  is_label = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == labels[..., None]
  target = jnp.where(is_label, 1.0 - label_smoothing, 0.0) + label_smoothing / num_classes
  grad = loss_cotangent[..., None] * (probabilities - target)
  return grad.astype(logits.dtype), None


_label_loss.defvjp(_label_loss_forward, _label_loss_backward)


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
