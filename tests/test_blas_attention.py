"""Attention on the BLAS (vit_jax.kernels.blas_attention): the same values and gradients as
`plain_attention`, masked or not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import kernels, models
from vit_jax.kernels import blas, blas_attention

try:
  BLAS = blas.load()
except blas.KernelUnavailable as error:  # No compiler or no BLAS on this machine.
  pytest.skip(f'BLAS kernels unavailable: {error}', allow_module_level=True)

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _the_same_inputs_whatever_ran_before():
  """Each test draws the same inputs, whichever tests its xdist worker ran before it."""
  RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


def _random(*shape):
  return jnp.asarray(RNG.standard_normal(shape, np.float32))


def test_attention_and_its_gradients_match_plain_attention():
  # Cross-attention shapes (T != S), heads interleaved in (B, T, N, H) as projected.
  query, key, value = _random(2, 5, 3, 8), _random(2, 7, 3, 8), _random(2, 7, 3, 8)
  reference = lambda q, k, v: models.plain_attention(q, k, v)[0]  # noqa: E731
  want_out = reference(query, key, value)
  # Called plainly, the kernel that keeps no weights; under jax.vjp, the one that does.
  assert blas.ATTENTION_INFERENCE_TARGET in str(jax.make_jaxpr(blas_attention.attention)(
      query, key, value))
  np.testing.assert_allclose(jax.jit(blas_attention.attention)(query, key, value), want_out,
                             rtol=1e-5, atol=1e-6)
  vjp_out = jax.jit(lambda *qkv: jax.vjp(blas_attention.attention, *qkv)[0])(query, key, value)
  np.testing.assert_allclose(vjp_out, want_out, rtol=1e-5, atol=1e-6)
  loss = lambda f: (lambda *qkv: jnp.sum(jnp.sin(3 * f(*qkv))))  # noqa: E731
  got = jax.jit(jax.grad(loss(blas_attention.attention), argnums=(0, 1, 2)))(query, key, value)
  want = jax.jit(jax.grad(loss(reference), argnums=(0, 1, 2)))(query, key, value)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _exact_weights(query, key, mask=None):
  """The attention weights (B, N, T, S) in float64; a query whose keys `mask` hides all
  weighs them all equally."""
  q, k = (np.asarray(x, np.float64) for x in (query, key))
  logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(mask, logits, -1e300)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True)


def _exact_attention(query, key, value, mask=None):
  """Attention in float64."""
  return np.einsum('bnts,bsnh->btnh', _exact_weights(query, key, mask),
                   np.asarray(value, np.float64))


@pytest.mark.skipif(not BLAS.bf16_symbol, reason=f'{BLAS.name} has no bfloat16 gemm')
def test_bfloat16_attention_is_within_bfloat16_rounding_of_the_exact_value():
  query, key, value = (x.astype(jnp.bfloat16) for x in (
      _random(2, 5, 3, 8), _random(2, 7, 3, 8), _random(2, 7, 3, 8)))
  bfloat16_attention = blas_attention.attention_bfloat16
  assert blas.ATTENTION_INFERENCE_BF16_TARGET in str(jax.make_jaxpr(bfloat16_attention)(
      query, key, value))
  got = jax.jit(bfloat16_attention)(query, key, value)
  assert got.dtype == jnp.bfloat16 and got.shape == query.shape
  exact = _exact_attention(query, key, value)
  # The weights and the result each rounded to bfloat16 (8 significant bits) once.
  np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2 ** -7,
                             atol=2 ** -8 * np.abs(exact).max())
  # A NaN in one query reaches that query's row of that head, and nothing else.
  nan_out = np.asarray(jax.jit(bfloat16_attention)(query.at[1, 2, 0, 3].set(jnp.nan), key,
                                                   value), np.float32)
  assert np.isnan(nan_out[1, 2, 0]).all() and np.isnan(nan_out).sum() == nan_out.shape[-1]


def _exact_attention_gradients(query, key, value, d_out, mask=None):
  """The gradients of q, k and v of `_exact_attention` for the cotangent `d_out`, float64;
  masked scores get none."""
  q, k, v, g = (np.asarray(x, np.float64) for x in (query, key, value, d_out))
  scale = 1 / np.sqrt(q.shape[-1])
  weights = _exact_weights(query, key, mask)
  d_weights = np.einsum('btnh,bsnh->bnts', g, v)
  d_logits = weights * (d_weights - (weights * d_weights).sum(-1, keepdims=True))
  if mask is not None:
    d_logits = np.where(mask, d_logits, 0.0)
  return (np.einsum('bnts,bsnh->btnh', d_logits, k) * scale,
          np.einsum('bnts,btnh->bsnh', d_logits, q) * scale,
          np.einsum('bnts,btnh->bsnh', weights, g))


def _assert_trains_within_bfloat16_rounding(query, key, value, mask=None):
  """Differentiated, `attention_bfloat16` runs the bfloat16 kernels both ways, and its
  result and gradients are within a few bfloat16 roundings of the exact ones."""
  rows = None if mask is None else blas_attention.mask_rows(mask, query.shape, key.shape)
  d_out = _random(*query.shape).astype(jnp.bfloat16)

  def vjp():
    out, pullback = jax.vjp(lambda *qkv: blas_attention.attention_bfloat16(*qkv, rows),
                            query, key, value)
    return (out, *pullback(d_out))

  jaxpr = str(jax.make_jaxpr(vjp)())
  assert blas.ATTENTION_FORWARD_BF16_TARGET in jaxpr
  assert blas.ATTENTION_BACKWARD_BF16_TARGET in jaxpr
  assert blas.ATTENTION_FORWARD_TARGET not in jaxpr
  got = jax.jit(vjp)()
  exact = (_exact_attention(query, key, value, mask),
           *_exact_attention_gradients(query, key, value, d_out, mask))
  for name, g, w in zip(('out', 'd_query', 'd_key', 'd_value'), got, exact):
    assert g.dtype == jnp.bfloat16 and g.shape == w.shape, name
    # The products' operands (the weights, their gradients, d_out) and the results are
    # each rounded to bfloat16 (8 significant bits), the sums kept in float32.
    np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2 ** -6,
                               atol=2 ** -7 * np.abs(w).max(), err_msg=name)


@pytest.mark.skipif(not BLAS.bf16_symbol, reason=f'{BLAS.name} has no bfloat16 gemm')
def test_bfloat16_attention_trains_on_the_bfloat16_kernels_within_rounding_of_exact():
  query, key, value = (x.astype(jnp.bfloat16) for x in (
      _random(2, 5, 3, 8), _random(2, 7, 3, 8), _random(2, 7, 3, 8)))
  _assert_trains_within_bfloat16_rounding(query, key, value)
  # ViT-S/16's shape: 197 tokens, 6 heads of 64.
  query, key, value = (_random(2, 197, 6, 64).astype(jnp.bfloat16) for _ in range(3))
  _assert_trains_within_bfloat16_rounding(query, key, value)


def test_bfloat16_attention_without_mkls_bfloat16_product_attends_in_float32(monkeypatch):
  monkeypatch.setattr(blas, 'has_bfloat16_products', lambda: False)
  query, key, value = (_random(2, 5, 3, 8).astype(jnp.bfloat16) for _ in range(3))
  jaxpr = str(jax.make_jaxpr(blas_attention.attention_bfloat16)(query, key, value))
  assert blas.ATTENTION_INFERENCE_TARGET in jaxpr
  assert blas.ATTENTION_INFERENCE_BF16_TARGET not in jaxpr
  float32 = (x.astype(jnp.float32) for x in (query, key, value))
  np.testing.assert_array_equal(
      np.asarray(jax.jit(blas_attention.attention_bfloat16)(query, key, value), np.float32),
      np.asarray(blas_attention.attention(*float32).astype(jnp.bfloat16), np.float32))
  # Differentiated: the float32 kernels both ways, the results rounded to bfloat16.
  cotangent = _random(2, 5, 3, 8).astype(jnp.bfloat16)

  def as_float32(q, k, v):
    return blas_attention.attention(*(x.astype(jnp.float32) for x in (q, k, v))).astype(
        jnp.bfloat16)

  def vjp(fn):
    out, pullback = jax.vjp(fn, query, key, value)
    return (out, *pullback(cotangent))

  jaxpr = str(jax.make_jaxpr(lambda: vjp(blas_attention.attention_bfloat16))())
  assert blas.ATTENTION_FORWARD_TARGET in jaxpr and blas.ATTENTION_BACKWARD_TARGET in jaxpr
  assert blas.ATTENTION_FORWARD_BF16_TARGET not in jaxpr
  got = jax.jit(lambda: vjp(blas_attention.attention_bfloat16))()
  want = jax.jit(lambda: vjp(as_float32))()
  for g, w in zip(got, want):
    assert g.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def _packed_masks(batch, queries, keys):
  """Masks as packed rows give them: (B, 1, T, S) booleans of segments (the first query
  of the first example in no segment: it sees no key) and, where T == S, causal order too."""
  query_segments = np.sort(RNG.integers(1, 4, (batch, queries)), axis=1)
  key_segments = np.sort(RNG.integers(1, 4, (batch, keys)), axis=1)
  query_segments[0, 0] = 9  # A query of no segment: every key hidden from it.
  mask = query_segments[:, None, :, None] == key_segments[:, None, None, :]
  if queries == keys:
    mask &= np.tril(np.ones((queries, keys), bool))
  assert not mask[0, 0, 0].any() and mask.any(-1).sum() > 1
  return jnp.asarray(mask)


@pytest.mark.parametrize('mask_shape', ['(B, 1, T, S)', '(1, 1, T, S)', '(T, S)', '(B, 1, 1, S)'])
@pytest.mark.parametrize('self_attention', [True, False])
def test_masked_attention_and_its_gradients_match_plain_attention(mask_shape, self_attention):
  batch, queries, keys = 3, 6, (6 if self_attention else 7)
  query, key, value = _random(batch, queries, 2, 8), _random(batch, keys, 2, 8), _random(
      batch, keys, 2, 8)
  mask = _packed_masks(batch, queries, keys)
  mask = {'(B, 1, T, S)': mask, '(1, 1, T, S)': mask[:1], '(T, S)': mask[0, 0],
          '(B, 1, 1, S)': mask[:, :, -1:]}[mask_shape]
  rows = blas_attention.mask_rows(mask, query.shape, key.shape)
  assert rows.dtype == bool and rows.shape == (mask.shape[0] if mask.ndim == 4 else 1,
                                               queries, keys)
  reference = lambda q, k, v: models.plain_attention(q, k, v, mask)[0]  # noqa: E731
  ours = lambda q, k, v: blas_attention.attention(q, k, v, rows)  # noqa: E731
  np.testing.assert_allclose(jax.jit(ours)(query, key, value), reference(query, key, value),
                             rtol=1e-5, atol=1e-6)
  loss = lambda f: (lambda *qkv: jnp.sum(jnp.sin(3 * f(*qkv))))  # noqa: E731
  got = jax.jit(jax.value_and_grad(loss(ours), argnums=(0, 1, 2)))(query, key, value)
  want = jax.jit(jax.value_and_grad(loss(reference), argnums=(0, 1, 2)))(query, key, value)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  # The query that sees no key: the mean of the values, and no gradient for its query.
  if mask_shape != '(B, 1, 1, S)':
    np.testing.assert_allclose(jax.jit(ours)(query, key, value)[0, 0], value[0].mean(0),
                               rtol=1e-5, atol=1e-6)
    assert not np.asarray(got[1][0][0, 0]).any()


def test_masks_that_differ_between_heads_are_not_for_the_kernels():
  assert blas_attention.mask_rows(jnp.ones((2, 3, 4, 5), bool), (2, 4, 3, 8), (2, 5, 3, 8)) is None
  assert blas_attention.mask_rows(jnp.ones((2, 1, 4, 5), bool), (2, 4, 3, 8),
                                  (2, 5, 3, 8)).shape == (2, 4, 5)


def test_a_mask_of_the_wrong_shape_is_an_error_not_a_wrong_answer():
  query = _random(2, 4, 2, 8)
  for shape in [(3, 4, 4), (2, 4, 5), (2, 1, 4)]:
    with pytest.raises(jax.errors.JaxRuntimeError, match='the mask is not'):
      jax.block_until_ready(
          jax.jit(blas_attention.attention)(query, query, query, jnp.ones(shape, bool)))


@pytest.mark.skipif(not BLAS.bf16_symbol, reason=f'{BLAS.name} has no bfloat16 gemm')
def test_masked_bfloat16_attention_is_within_bfloat16_rounding_of_the_exact_value():
  query, key, value = (x.astype(jnp.bfloat16) for x in (
      _random(3, 6, 2, 8), _random(3, 6, 2, 8), _random(3, 6, 2, 8)))
  mask = _packed_masks(3, 6, 6)
  rows = blas_attention.mask_rows(mask, query.shape, key.shape)
  jaxpr = str(jax.make_jaxpr(blas_attention.attention_bfloat16)(query, key, value, rows))
  assert blas.ATTENTION_INFERENCE_BF16_TARGET in jaxpr
  got = jax.jit(blas_attention.attention_bfloat16)(query, key, value, rows)
  exact = _exact_attention(query, key, value, mask)
  np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2 ** -7,
                             atol=2 ** -8 * np.abs(exact).max())
  # Differentiated: the bfloat16 kernels both ways, masked.
  _assert_trains_within_bfloat16_rounding(query, key, value, mask)


def test_the_attention_module_runs_masked_calls_on_the_blas_unless_heads_differ():
  layer = models.MultiHeadDotProductAttention(num_heads=2, implementation='blas')
  x = _random(2, 6, 8)
  variables = layer.init(jax.random.PRNGKey(0), x)
  valid = jnp.arange(6)[None] < jnp.array([[4], [6]])
  padding = models.make_padding_mask(valid, valid)  # (B, 1, T, S)
  per_head = jnp.broadcast_to(padding, (2, 2, 6, 6)).at[:, 1, :, 0].set(False)
  for mask, kernel in [(padding, True), (per_head, False)]:
    for causal in (False, True):
      run = lambda impl, m=mask, c=causal: layer.clone(implementation=impl).apply(  # noqa: E731
          variables, x, mask=m, causal=c)
      np.testing.assert_allclose(jax.jit(lambda: run('blas'))(), run('plain'), rtol=1e-5,
                                 atol=1e-6)
      jaxpr = str(jax.make_jaxpr(lambda: run('blas'))())
      assert (blas.ATTENTION_INFERENCE_TARGET in jaxpr) == kernel, (mask.shape, causal)


def test_a_packed_seq2seq_step_attends_on_the_blas_with_the_same_loss_and_gradients():
  # Two examples packed into each row: segment masks in the encoder, the decoder and across.
  model = models.get_model('Transformer-testing', vocab_size=13, dropout_rate=0.0)
  source = jnp.asarray(RNG.integers(1, 13, (2, 8)), jnp.int32)
  target = jnp.asarray(RNG.integers(1, 13, (2, 6)), jnp.int32)
  segments = lambda n, cut: jnp.asarray([[1] * cut + [2] * (n - cut)] * 2, jnp.int32)  # noqa: E731
  extra = dict(inputs_segmentation=segments(8, 5), targets_segmentation=segments(6, 2))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), source, target, **extra)['params']
  loss = lambda p: jnp.sum(jax.nn.log_softmax(  # noqa: E731
      model.apply({'params': p}, source, target, **extra))[..., 2])

  def on_blas(fn):
    def run(*args):
      with kernels.use('blas'):
        return fn(*args)
    return run

  jaxpr = str(jax.make_jaxpr(on_blas(jax.grad(loss)))(params))
  # All six attention layers (two each: the encoder's, the decoder's, across), both ways.
  assert jaxpr.count(blas.ATTENTION_FORWARD_TARGET) == 6
  assert jaxpr.count(blas.ATTENTION_BACKWARD_TARGET) == 6
  np.testing.assert_allclose(jax.jit(on_blas(loss))(params), jax.jit(loss)(params), rtol=1e-5)
  got = jax.jit(on_blas(jax.grad(loss)))(params)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(jax.jit(jax.grad(loss))(params))):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
