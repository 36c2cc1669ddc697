"""Chunked (memory-efficient) attention: equal to the plain path in values and grads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import cached_teacher_forced_logits

from vit_jax import models
from vit_jax.models import attention, attention_chunked


# Inputs are built with numpy: eager jax ops would each compile for every new shape.


def _random_qkv(t, s, heads=3, head_dim=8, batch=2, dtype=jnp.float32):
  rng = np.random.default_rng(0)
  return tuple(jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), dtype)
               for length in (t, s, s))


def _mask(name, t, s):
  """Masks broadcastable to (B, N, T, S); 'padding' has fully masked query rows."""
  query_valid = np.arange(t)[None] < np.array([[t], [t - 2]])  # (B, T)
  key_valid = np.arange(s)[None] < np.array([[s], [s - 3]])  # (B, S)
  padding = query_valid[:, None, :, None] & key_valid[:, None, None, :]  # (B, 1, T, S)
  causal = np.tril(np.ones((t, s), bool))[None, None]  # (1, 1, T, S)
  rank2 = np.ones((t, s), bool)
  rank2[:, -1] = False
  return {'none': None, 'padding': padding, 'causal': causal,
          'padding+causal': padding & causal,
          'keys only': key_valid[:, None, None, :],  # (B, 1, 1, S)
          'rank 2': rank2}[name]


CASES = [
    # (T, S, chunk_size, mask): one chunk, exact multiples, padded last chunks.
    (6, 6, 512, 'none'), (6, 6, 512, 'causal'),
    (12, 12, 4, 'none'), (12, 12, 4, 'padding+causal'),
    (13, 13, 5, 'padding'), (13, 13, 5, 'causal'), (13, 13, 5, 'padding+causal'),
    (7, 11, 3, 'none'), (7, 11, 3, 'padding'), (7, 11, 4, 'keys only'),
    (9, 10, 4, 'rank 2'), (1, 17, 8, 'keys only'),
]


@pytest.mark.parametrize('t,s,chunk_size,mask_name', CASES)
def test_chunked_equals_plain_values_and_grads(t, s, chunk_size, mask_name):
  mask = _mask(mask_name, t, s)
  q, k, v = _random_qkv(t, s)
  probe = np.random.default_rng(1).standard_normal(q.shape)  # An output cotangent.

  @jax.jit
  def value_and_grads(q, k, v):
    plain = lambda q, k, v: attention.plain_attention(q, k, v, mask)[0]  # noqa: E731
    chunked = lambda q, k, v: attention_chunked.chunked_attention(  # noqa: E731
        q, k, v, mask, chunk_size=chunk_size)
    grads = lambda f: jax.grad(  # noqa: E731
        lambda q, k, v: jnp.sum(f(q, k, v) * probe), argnums=(0, 1, 2))(q, k, v)
    return (chunked(q, k, v), grads(chunked)), (plain(q, k, v), grads(plain))

  (out, grads), (want_out, want_grads) = value_and_grads(q, k, v)
  np.testing.assert_allclose(out, want_out, atol=1e-5, rtol=0)
  for got, want, name in zip(grads, want_grads, 'qkv'):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f'd{name}')


def test_chunked_under_jit_and_vmap():
  q, k, v = _random_qkv(5, 9)
  f = jax.jit(lambda q, k, v: attention_chunked.chunked_attention(q, k, v, chunk_size=4))
  np.testing.assert_allclose(f(q, k, v), attention.plain_attention(q, k, v)[0], atol=1e-5)
  per_example = jax.vmap(lambda q, k, v: attention_chunked.chunked_attention(
      q[None], k[None], v[None], chunk_size=4)[0])(q, k, v)
  np.testing.assert_allclose(per_example, f(q, k, v), atol=1e-6)


def test_chunked_bfloat16():
  q, k, v = _random_qkv(10, 10, dtype=jnp.bfloat16)
  mask = _mask('padding+causal', 10, 10)
  chunked = lambda q: attention_chunked.chunked_attention(q, k, v, mask, chunk_size=4)  # noqa: E731

  @jax.jit
  def run(q):
    reference = attention.plain_attention(*(x.astype(jnp.float32) for x in (q, k, v)),
                                          mask)[0]
    grad = jax.grad(lambda q: jnp.sum(chunked(q).astype(jnp.float32)))(q)
    return chunked(q), reference, grad

  out, reference, grad = run(q)
  assert out.dtype == jnp.bfloat16 and grad.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), reference, atol=3e-2, rtol=0)
  assert np.isfinite(np.asarray(grad, np.float32)).all()


def test_chunked_rejects_bad_arguments():
  q, k, v = _random_qkv(4, 4)
  with pytest.raises(ValueError, match='chunk_size must be positive'):
    attention_chunked.chunked_attention(q, k, v, chunk_size=0)
  with pytest.raises(ValueError, match='broadcast to'):
    attention_chunked.chunked_attention(q, k, v, np.ones((1, 1, 1, 4, 4), bool))


def test_module_option_keeps_params_and_output():
  layer = models.MultiHeadDotProductAttention(num_heads=2)
  x = np.random.default_rng(2).standard_normal((2, 9, 8)).astype(np.float32)
  variables = jax.jit(layer.init)(jax.random.key(3), x)
  chunked = layer.clone(implementation='chunked', attention_chunk_size=4)
  assert jax.tree.structure(jax.eval_shape(chunked.init, jax.random.key(3), x)) == (
      jax.tree.structure(variables))
  mask = attention.make_causal_mask(9)

  @jax.jit
  def outputs(variables):
    return (chunked.apply(variables, x, mask=mask), layer.apply(variables, x, mask=mask),
            chunked.apply(variables, x, return_weights=True), layer.apply(variables, x))

  with_mask, want_with_mask, (out, weights), want = outputs(variables)
  np.testing.assert_allclose(with_mask, want_with_mask, atol=1e-5, rtol=0)
  assert weights.shape == (2, 2, 9, 9)  # return_weights takes the plain path.
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=0)


def test_tiny_vit_with_chunked_attention_matches_fused():
  images = np.random.default_rng(4).standard_normal((2, 16, 16, 3))  # 17 tokens.
  fused = models.get_model('ViT-testing', num_classes=3, attention_impl='fused')
  variables = jax.jit(lambda rng: jax.tree.map(  # A nonzero head: logits not all zero.
      lambda p: p + 0.1 * jax.random.normal(rng, p.shape), fused.init(rng, images)))(
          jax.random.key(5))
  chunked = models.get_model('ViT-testing', num_classes=3, attention_impl='chunked')
  np.testing.assert_allclose(jax.jit(chunked.apply)(variables, images),
                             jax.jit(fused.apply)(variables, images), atol=1e-5, rtol=0)


def test_transformer_cached_decoding_with_chunked_attention():
  model = models.get_model('Transformer-testing', vocab_size=13, attention_impl='chunked')
  inputs = np.array([[5, 6, 7, 0], [3, 4, 0, 0]])
  targets = np.array([[11, 12, 3, 4, 5], [3, 9, 9, 4, 0]])
  variables = jax.jit(model.init)(jax.random.key(0), inputs, targets)
  full = jax.jit(model.apply)(variables, inputs, targets)
  np.testing.assert_allclose(full, jax.jit(model.clone(attention_impl='plain').apply)(
      variables, inputs, targets), atol=1e-5, rtol=0)
  steps = cached_teacher_forced_logits(model, variables['params'], inputs, targets)
  valid = np.asarray(targets > 0)  # Padded target positions are garbage in both.
  np.testing.assert_allclose(np.asarray(steps)[valid], np.asarray(full)[valid],
                             atol=1e-5, rtol=0)
