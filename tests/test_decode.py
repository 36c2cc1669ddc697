"""Greedy and beam search: cache vs no cache, beam 1 vs greedy, EOS handling.

The searches run under `jax.jit`, as in use: eagerly, each of their operations would be
dispatched and compiled on its own.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax import decode, models

# Its tests share a costly module fixture: one worker runs them all (--dist=loadgroup).
pytestmark = pytest.mark.xdist_group('decode')

VOCAB = 13


def greedy_decode(model, params, inputs, **kwargs):
  return jax.jit(functools.partial(decode.greedy_decode, model, **kwargs))(params, inputs)


def beam_search(model, params, inputs, **kwargs):
  return jax.jit(functools.partial(decode.beam_search, model, **kwargs))(params, inputs)


@pytest.fixture(scope='module')
def setup():
  model = models.get_model('Transformer-testing', vocab_size=VOCAB, dropout_rate=0.0)
  inputs = jnp.array([[5, 6, 7, 8, 0, 0], [3, 4, 9, 0, 0, 0], [2, 2, 2, 2, 2, 2]])
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), inputs, jnp.ones((3, 5), jnp.int32))
  # Sharper, more varied output distributions than the small-init ones.
  params = jax.tree.map(lambda x: x * 3.0, variables['params'])
  return model, params, inputs


def test_cached_greedy_equals_rerunning_the_full_decoder(setup):
  model, params, inputs = setup
  cached = greedy_decode(model, params, inputs, max_length=10)
  uncached = greedy_decode(model, params, inputs, max_length=10, use_cache=False)
  np.testing.assert_array_equal(cached, uncached)
  assert len({tuple(row) for row in np.asarray(cached)}) > 1  # Not a trivial output.


def test_a_single_step_decodes_the_first_token(setup):
  # The first step runs before the loop (it completes the cache): alone it is the whole decode.
  model, params, inputs = setup
  greedy = greedy_decode(model, params, inputs, max_length=10)
  np.testing.assert_array_equal(greedy_decode(model, params, inputs, max_length=1),
                                greedy[:, :1])
  tokens, _ = beam_search(model, params, inputs, max_length=1, beam_size=1, alpha=0.0)
  np.testing.assert_array_equal(tokens[:, 0], greedy[:, :1])


def test_beam_of_one_equals_greedy(setup):
  model, params, inputs = setup
  greedy = greedy_decode(model, params, inputs, max_length=10)
  tokens, scores = beam_search(model, params, inputs, max_length=10, beam_size=1, alpha=0.0)
  assert tokens.shape == (3, 1, 10) and scores.shape == (3, 1)
  np.testing.assert_array_equal(tokens[:, 0], greedy)


def _sequence_log_probs(model, params, inputs, sequences):
  """log p(sequence | inputs) by teacher forcing, for every sequence (N, L) and input row."""
  repeated = jnp.repeat(inputs, sequences.shape[0], axis=0)
  tiled = jnp.tile(sequences, (inputs.shape[0], 1))
  log_probs = jax.nn.log_softmax(jax.jit(model.apply)({'params': params}, repeated, tiled))
  picked = jnp.take_along_axis(log_probs, tiled[..., None], -1)[..., 0]
  return jnp.sum(jnp.where(tiled > 0, picked, 0.0), -1).reshape(inputs.shape[0], -1)


def test_a_wide_beam_finds_the_most_likely_sequence(setup):
  model, params, inputs = setup
  # Every finished output of up to 3 tokens: [EOS], [a, EOS], [a, b, EOS] (a, b not EOS/pad).
  words = range(2, VOCAB)
  candidates = ([[1, 0, 0]] + [[a, 1, 0] for a in words] +
                [[a, b, 1] for a in words for b in words])
  candidates = jnp.array(candidates, jnp.int32)
  exact = _sequence_log_probs(model, params, inputs, candidates)  # (B, 133)
  # 121 beams keep every unfinished 2-token prefix: the search is exhaustive.
  tokens, scores = beam_search(model, params, inputs, max_length=3, beam_size=121, alpha=0.0)
  assert np.all(np.diff(np.asarray(scores), axis=1) <= 1e-6)  # Best first.
  np.testing.assert_allclose(scores[:, 0], exact.max(axis=1), atol=1e-4)
  np.testing.assert_array_equal(tokens[:, 0], candidates[jnp.argmax(exact, axis=1)])


def test_length_penalty_prefers_longer_outputs(setup):
  model, params, inputs = setup
  lengths = []
  for alpha in (0.0, 2.0):
    tokens, _ = beam_search(model, params, inputs, max_length=6, beam_size=8, alpha=alpha)
    lengths.append(int(jnp.sum(tokens[:, 0] > 0)))
  assert lengths[1] >= lengths[0]


def test_tokens_after_eos_are_padding():
  # A tiny model trained to copy its input (1 to 5 tokens) and then emit EOS: with
  # max_length 4, the short copies of a batch end at different positions while the long
  # ones run out of room. Its logits come from a Dense layer, so lowering the EOS bias
  # makes a model that never ends.
  model = models.get_model('Transformer-testing', vocab_size=VOCAB, dropout_rate=0.0,
                           logits_via_embedding=False)
  rng = np.random.default_rng(0)

  def copy_batch(size=64, length=6):
    lengths = rng.integers(1, length, size)
    sources = rng.integers(2, VOCAB, (size, length)) * (np.arange(length) < lengths[:, None])
    targets = np.pad(sources, ((0, 0), (0, 1)))
    targets[np.arange(size), lengths] = 1
    return jnp.asarray(sources, jnp.int32), jnp.asarray(targets, jnp.int32)

  tx = optax.adam(3e-3)

  @jax.jit
  def train_step(params, opt_state, sources, targets):
    def loss(params):
      logits = model.apply({'params': params}, sources, targets)
      losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
      return jnp.sum(losses * (targets > 0)) / jnp.sum(targets > 0)
    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state

  params = jax.jit(model.init)(jax.random.PRNGKey(0), *copy_batch(2))['params']
  opt_state = tx.init(params)
  for _ in range(150):
    params, opt_state = train_step(params, opt_state, *copy_batch())
  no_eos = jax.tree.map(lambda x: x, params)
  no_eos['decoder']['logits']['bias'] = params['decoder']['logits']['bias'].at[1].add(-1e4)
  # Copies of 5, 3, 2, 1, 5 and 4 tokens: only those of 1 to 3 tokens fit with their EOS.
  inputs = jnp.array([[5, 6, 7, 8, 9, 0], [3, 4, 9, 0, 0, 0], [7, 3, 0, 0, 0, 0],
                      [4, 0, 0, 0, 0, 0], [12, 11, 10, 9, 8, 0], [2, 2, 2, 2, 0, 0]])
  max_length = 4

  def first_eos(tokens):
    """Each row's first EOS position (None: no EOS), checking the row around it."""
    tokens = np.asarray(tokens)
    assert tokens.shape == (inputs.shape[0], max_length)
    positions = []
    for row in tokens:
      eos = np.flatnonzero(row == 1)
      end = int(eos[0]) if eos.size else max_length
      assert np.all(row[:end] > 1), row  # Real tokens up to the EOS (all of max_length
      assert np.all(row[end + 1:] == 0), row  # without one), only padding after it.
      positions.append(end if eos.size else None)
    return positions

  for name, decoder in (
      ('greedy', lambda p: decode.greedy_decode(model, p, inputs, max_length=max_length)),
      ('beam', lambda p: decode.beam_search(model, p, inputs, max_length=max_length)[0][:, 0])):
    run = jax.jit(decoder)
    ends = first_eos(run(params))
    assert len({ends[1], ends[2], ends[3]} - {None}) == 3, (name, ends)  # Three lengths.
    if name == 'greedy':  # Rows that end and rows that run out of room, in one batch.
      assert ends[0] is None and ends[4] is None and ends[5] is None, ends
    assert first_eos(run(no_eos)) == [None] * inputs.shape[0], name
