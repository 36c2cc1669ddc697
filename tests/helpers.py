"""Shared test helpers."""

import json
import os

import jax
import jax.numpy as jnp


def override(config, overrides: dict):
  """Sets `config[a][b] = value` for each 'a.b' key in `overrides`; returns `config`."""
  for key, value in overrides.items():
    target = config
    *parents, leaf = key.split('.')
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config


def read_metrics(workdir, split):
  """The rows of WORKDIR/metrics.jsonl for `split` ('train' or 'test')."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [row for row in map(json.loads, f) if row['split'] == split]


def cached_teacher_forced_logits(model, params, inputs, targets):
  """Logits (B, T, V) from decoding `targets` one token at a time with the k/v cache."""
  decoder = model.clone(cached_decoding=True)
  cache = decoder.init(jax.random.key(0), inputs, targets)['cache']
  encoded = model.apply({'params': params}, inputs, method='encode')

  @jax.jit
  def step(cache, token):
    logits, updated = decoder.apply({'params': params, 'cache': cache}, encoded, inputs,
                                    token, method='decode', mutable=['cache'])
    return updated['cache'], logits[:, 0]

  token, steps = jnp.zeros((inputs.shape[0], 1), jnp.int32), []
  for t in range(targets.shape[1]):
    cache, logits = step(cache, token)
    steps.append(logits)
    token = targets[:, t:t + 1]  # Teacher forcing: the next input is target t.
  return jnp.stack(steps, axis=1)
