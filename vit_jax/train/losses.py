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
