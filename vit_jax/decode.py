"""Autoregressive decoding for the seq2seq Transformer: greedy and beam search.

Both run with the key/value cache (`Transformer(cached_decoding=True)`) inside
`jax.lax.while_loop`, so they jit-compile to one program and stop early once
every sequence has produced EOS. The first step runs before the loop: it adds the
cross-attention keys/values to the cache, which the later steps only read.
`greedy_decode(..., use_cache=False)` re-runs the full decoder each step instead
(the slow reference).

Token conventions: 0 is padding and the start token, `eos_id` (1) ends a sequence.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.attention import CROSS_ATTENTION_CACHE

Array = jax.Array
NEG_INF = -1.0e9  # Log-probability of impossible hypotheses (finite: no NaN in arithmetic).


def init_cache(model: nn.Module, inputs: Array, max_length: int) -> Any:
  """An empty decoding cache for batches like `inputs` and outputs up to `max_length`."""
  decoder = model.clone(cached_decoding=True)
  targets = jnp.zeros((inputs.shape[0], max_length), jnp.int32)
  return jax.eval_shape(lambda: decoder.init(jax.random.PRNGKey(0), inputs, targets))['cache']


def _zeros_like_tree(tree):
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)


def _step_fn(model: nn.Module, params, encoded: Array, inputs: Array):
  """(cache, previous tokens (B, 1)) -> (cache, log-probabilities (B, V))."""
  decoder = model.clone(cached_decoding=True)

  def step(cache, tokens):
    logits, updated = decoder.apply({'params': params, 'cache': cache}, encoded, inputs,
                                    tokens, method='decode', mutable=['cache'])
    return updated['cache'], _output_log_probs(logits[:, 0])
  return step


def _output_log_probs(logits: Array) -> Array:
  """Log-softmax over the vocabulary; padding (0) is never an output token."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  return log_probs.at[..., 0].set(NEG_INF)


def greedy_decode(model: nn.Module, params, inputs: Array, *, max_length: int,
                  eos_id: int = 1, use_cache: bool = True) -> Array:
  """Most likely next token at each step; returns tokens (B, max_length), 0 after EOS."""
  batch = inputs.shape[0]
  encoded = model.apply({'params': params}, inputs, method='encode')

  if use_cache:
    step = _step_fn(model, params, encoded, inputs)
    state0 = _zeros_like_tree(init_cache(model, inputs, max_length))
  else:
    def step(prefix, _):  # Re-run the whole decoder on the prefix so far.
      logits = model.apply({'params': params}, encoded, inputs, prefix, method='decode')
      return prefix, _output_log_probs(logits)
    state0 = None

  def body(carry):
    i, tokens, state, done = carry
    if use_cache:
      previous = jnp.where(i == 0, 0, tokens[:, jnp.maximum(i - 1, 0)])[:, None]
      state, log_probs = step(state, previous)
    else:
      # Position i must count as a real token for the decoder's padding mask; what
      # stands there only affects later positions.
      _, all_log_probs = step(tokens.at[:, i].set(eos_id), None)
      log_probs = all_log_probs[:, i]
    next_token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    next_token = jnp.where(done, 0, next_token)
    tokens = tokens.at[:, i].set(next_token)
    return i + 1, tokens, state, done | (next_token == eos_id)

  def cond(carry):
    i, _, _, done = carry
    return (i < max_length) & ~jnp.all(done)

  carry = (jnp.array(0), jnp.zeros((batch, max_length), jnp.int32), state0,
           jnp.zeros((batch,), bool))
  if use_cache and max_length:  # The first step adds the cross-attention keys/values.
    carry = body(carry)
  _, tokens, _, _ = jax.lax.while_loop(cond, body, carry)
  return tokens


def length_penalty(length: Array, alpha: float) -> Array:
  """GNMT's ((5 + length) / 6)^alpha; scores are log-probability / penalty."""
  return ((5.0 + length) / 6.0) ** alpha


def _gather_beams(x: Array, indices: Array) -> Array:
  """x (B, K, ...) -> (B, K', ...): the beams `indices` (B, K') of each example."""
  return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), 1)


def _gather_cache(cache, indices: Array, beam_size: int):
  """Like `_gather_beams` on a cache whose leaves are (B*K, ...).

  Scalars are shared, and the cross-attention keys/values are the same for every
  beam of an example: both stay as they are.
  """
  def gather(path, x):
    if x.ndim == 0 or getattr(path[-1], 'key', None) in CROSS_ATTENTION_CACHE:
      return x
    beams = x.reshape((-1, beam_size) + x.shape[1:])  # (B, K, ...)
    return _gather_beams(beams, indices).reshape(x.shape)
  return jax.tree_util.tree_map_with_path(gather, cache)


def beam_search(model: nn.Module, params, inputs: Array, *, max_length: int,
                beam_size: int = 4, alpha: float = 0.6,
                eos_id: int = 1) -> tuple[Array, Array]:
  """Beam search with a length penalty; returns (tokens (B, K, L), scores (B, K)), best first.

  A hypothesis ends when it emits `eos_id`; the search stops once no live
  hypothesis can beat the worst finished one. With `alpha=0` and `beam_size=1`
  it returns exactly the greedy decoding.
  """
  batch, k = inputs.shape[0], beam_size
  encoded = model.apply({'params': params}, inputs, method='encode')
  # Every beam of an example attends to that example's encoding: (B*K, S, ...).
  encoded_beams = jnp.repeat(encoded, k, axis=0)
  inputs_beams = jnp.repeat(inputs, k, axis=0)
  step = _step_fn(model, params, encoded_beams, inputs_beams)
  cache = _zeros_like_tree(init_cache(model, inputs_beams, max_length))

  live_tokens = jnp.zeros((batch, k, max_length), jnp.int32)
  live_log_probs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (batch, 1))  # (B, K)
  finished_tokens = jnp.zeros((batch, k, max_length), jnp.int32)
  finished_scores = jnp.full((batch, k), NEG_INF)

  def body(carry):
    i, live_tokens, live_log_probs, finished_tokens, finished_scores, cache = carry
    previous = jnp.where(i == 0, 0, live_tokens[:, :, jnp.maximum(i - 1, 0)])  # (B, K)
    cache, log_probs = step(cache, previous.reshape(batch * k, 1))
    vocab = log_probs.shape[-1]
    candidates = live_log_probs[:, :, None] + log_probs.reshape(batch, k, vocab)
    top_log_probs, top_ids = jax.lax.top_k(candidates.reshape(batch, k * vocab), 2 * k)
    top_beams, top_tokens = top_ids // vocab, (top_ids % vocab).astype(jnp.int32)  # (B, 2K)
    top_seqs = _gather_beams(live_tokens, top_beams)  # (B, 2K, L)
    top_seqs = top_seqs.at[:, :, i].set(top_tokens)
    ended = top_tokens == eos_id

    # Finished: the candidates that just emitted EOS, merged with the earlier ones.
    new_scores = jnp.where(ended, top_log_probs / length_penalty(i + 1, alpha), NEG_INF)
    all_scores = jnp.concatenate([finished_scores, new_scores], axis=1)
    all_tokens = jnp.concatenate([finished_tokens, top_seqs], axis=1)
    finished_scores, keep = jax.lax.top_k(all_scores, k)
    finished_tokens = jnp.take_along_axis(all_tokens, keep[:, :, None], axis=1)

    # Live: the best K candidates that did not end.
    live_candidates = jnp.where(ended, NEG_INF, top_log_probs)
    live_log_probs, keep = jax.lax.top_k(live_candidates, k)
    live_tokens = jnp.take_along_axis(top_seqs, keep[:, :, None], axis=1)
    cache = _gather_cache(cache, jnp.take_along_axis(top_beams, keep, axis=1), k)
    return i + 1, live_tokens, live_log_probs, finished_tokens, finished_scores, cache

  def cond(carry):
    i, _, live_log_probs, _, finished_scores, _ = carry
    # Log-probabilities only fall, so the best live hypothesis can at most reach its
    # current log-probability under the largest length penalty.
    best_live = live_log_probs[:, 0] / length_penalty(max_length, alpha)
    worst_finished = jnp.where(jnp.all(finished_scores > NEG_INF, axis=1),
                               finished_scores[:, -1], NEG_INF)
    return (i < max_length) & ~jnp.all(best_live < worst_finished)

  carry = (jnp.array(0), live_tokens, live_log_probs, finished_tokens, finished_scores, cache)
  if max_length:  # The first step adds the cross-attention keys/values to the cache.
    carry = body(carry)
  _, live_tokens, live_log_probs, finished_tokens, finished_scores, _ = jax.lax.while_loop(
      cond, body, carry)
  # Examples with no finished hypothesis fall back to their live ones.
  any_finished = jnp.any(finished_scores > NEG_INF, axis=1)[:, None]
  live_scores = live_log_probs / length_penalty(max_length, alpha)
  tokens = jnp.where(any_finished[:, :, None], finished_tokens, live_tokens)
  scores = jnp.where(any_finished, finished_scores, live_scores)
  return tokens, scores
