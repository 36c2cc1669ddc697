"""Attention masks: boolean (B, 1, T, S) arrays, True where query t may attend to key s.

Also `KeyPadding`, the padding that `layers.Encoder` adds for a kernel that wants other
lengths, which kernels may take as sequence lengths rather than as a boolean array.
"""

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


@flax.struct.dataclass
class KeyPadding:
  """Keys from `length` on are padding: no query may attend to them.

  `layers.Encoder` pads its tokens for a kernel that wants other lengths (cuDNN: even)
  and passes this instead of a boolean mask: cuDNN takes it as sequence lengths, with no
  bias to read or differentiate. `as_mask` is the same as a boolean mask.
  """
  length: int = flax.struct.field(pytree_node=False)  # Real keys, the first `length`.

  def as_mask(self, keys: int) -> Array:
    """Boolean mask (1, 1, 1, keys): True for the first `length` keys."""
    return (jnp.arange(keys) < self.length)[None, None, None, :]


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
