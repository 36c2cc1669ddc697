"""Dropout masks from a counter hash instead of threefry.

`jax.random.bernoulli` runs threefry2x32 (20 rounds) for every 32 random bits; on CPUs a
Transformer's dropout masks then cost as much as a large part of its matrix products.
`bernoulli` hashes each element's index with the key's words (murmur3's 32-bit finaliser,
applied once per key word and once more): a few integer operations per element that
XLA vectorises. Each element is kept with probability `p` (to 2^-32), masks of different
keys are unrelated, and the masks are as deterministic as the keys. It is not a
cryptographic generator, nor meant for anything but dropout.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _mix(h: jax.Array) -> jax.Array:
  """murmur3's fmix32: every input bit affects every output bit (uint32 in, uint32 out)."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def bernoulli(key: jax.Array, p: float, shape: tuple[int, ...]) -> jax.Array:
  """Bool array of `shape`, each element True with probability `p`, from `key`.

  `key` is a typed key (`jax.random.key`) or raw uint32 key data (`jax.random.PRNGKey`).
  Masks of 2^32 elements or more come from `jax.random.bernoulli`.
  """
  if not 0 <= p <= 1:
    raise ValueError(f'p={p} is not a probability: expected a number in [0, 1].')
  size = int(np.prod(shape, dtype=np.int64))
  if size >= 2**32:
    return jax.random.bernoulli(key, p, shape)
  words = key if key.dtype == jnp.uint32 else jax.random.key_data(key)
  h = jax.lax.iota(jnp.uint32, size).reshape(shape)  # Each element's index.
  for word in jnp.ravel(words):
    h = _mix(h ^ word)
  h = _mix(h + jnp.uint32(0x9E3779B9))
  threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
  return h < jnp.uint32(threshold)
