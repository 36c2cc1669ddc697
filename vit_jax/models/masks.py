"""Attention masks: boolean (B, 1, T, S) arrays, True where query t may attend to key s."""

import jax
import jax.numpy as jnp

Array = jax.Array


def make_padding_mask(query_valid: Array, key_valid: Array) -> Array:
  """Boolean mask (B, 1, T, S): True where both query t and key s are valid.

  Args:
    query_valid: (B, T) bool or 0/1, e.g. `query_tokens > 0`.
    key_valid: (B, S) bool or 0/1.
  """
  return jnp.logical_and(query_valid[:, None, :, None].astype(bool),
                         key_valid[:, None, None, :].astype(bool))


def make_segment_mask(query_segments: Array, key_segments: Array) -> Array:
  """Boolean mask (B, 1, T, S): True where query t and key s are in the same segment.

  Segments number the examples packed into one row (1, 2, ...; 0 is padding).
  """
  return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def make_causal_mask(length: int) -> Array:
  """Boolean mask (1, 1, T, T): query t sees keys 0..t."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None (None if all are)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  mask = masks[0].astype(bool)
  for m in masks[1:]:
    mask = jnp.logical_and(mask, m.astype(bool))
  return mask
