"""Attention: a worked numpy example (4 words, random 3x3 projections), kernels vs plain,
'auto', masks, order blindness."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import kernels, models
from vit_jax.kernels import blas
from vit_jax.models import attention, backend


def _attention_params(wq, wk, wv, wo):
  """Single-head, bias-free params for MultiHeadDotProductAttention."""
  as_heads = lambda w: jnp.asarray(w, jnp.float32)[:, None, :]  # (D, 1, H)  # noqa: E731
  return {'params': {'query': {'kernel': as_heads(wq)}, 'key': {'kernel': as_heads(wk)},
                     'value': {'kernel': as_heads(wv)},
                     'out': {'kernel': jnp.asarray(wo, jnp.float32)[None]}}}


@pytest.mark.parametrize('implementation', ['auto', 'fused', 'plain'])
def test_numpy_example_from_the_notes(implementation):
  np.random.seed(2022)
  wq, wk, wv = (np.random.randint(3, size=(3, 3)) for _ in range(3))
  np.testing.assert_array_equal(wq, [[1, 0, 1], [0, 1, 1], [0, 0, 2]])
  words = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1]], np.float32)
  expected = np.array([[2.21359886, 0.30694765, 2.82049348],
                       [2.23868629, 0.10809678, 3.03431245],
                       [2.4970757, 0.04543788, 3.42891888],
                       [2.47368968, 0.04330015, 3.36169225]])
  layer = models.MultiHeadDotProductAttention(num_heads=1, use_bias=False,
                                              implementation=implementation)
  variables = _attention_params(wq, wk, wv, np.eye(3))
  out = layer.apply(variables, jnp.asarray(words)[None])[0]
  np.testing.assert_allclose(out, expected, atol=1e-6, rtol=0)


def _random_qkv(t=6, s=6, heads=3, head_dim=8, batch=2):
  keys = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(keys[0], (batch, t, heads, head_dim)),
          jax.random.normal(keys[1], (batch, s, heads, head_dim)),
          jax.random.normal(keys[2], (batch, s, heads, head_dim)))


def _masks(t, s):
  query_valid = jnp.array([[1] * t, [1] * (t - 2) + [0] * 2])
  key_valid = jnp.array([[1] * s, [1] * (s - 3) + [0] * 3])
  padding = attention.make_padding_mask(query_valid, key_valid)
  causal = attention.make_causal_mask(t) if t == s else None
  return {'none': None, 'padding': padding, 'causal': causal,
          'padding+causal': attention.combine_masks(padding, causal)}


@pytest.mark.parametrize('lengths,mask_name', [
    ((6, 6), 'none'), ((6, 6), 'padding'), ((6, 6), 'causal'), ((6, 6), 'padding+causal'),
    ((4, 7), 'none'), ((4, 7), 'padding')])
def test_fused_head_major_and_plain_paths_agree(lengths, mask_name):
  t, s = lengths
  mask = _masks(t, s)[mask_name]
  q, k, v = _random_qkv(t, s)
  plain, weights = attention.plain_attention(q, k, v, mask)
  np.testing.assert_allclose(attention.fused_attention(q, k, v, mask), plain, atol=1e-5, rtol=0)
  np.testing.assert_allclose(attention.head_major_attention(q, k, v, mask), plain, atol=1e-5,
                             rtol=0)
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
  if mask is not None:  # Masked keys get no weight where a row has any valid key.
    valid_rows = jnp.broadcast_to(mask, weights.shape).any(-1, keepdims=True)
    assert float(jnp.where(~mask & valid_rows, weights, 0).max()) < 1e-30


def test_module_paths_share_parameters_and_agree():
  x = jax.random.normal(jax.random.key(1), (2, 5, 16))
  y = jax.random.normal(jax.random.key(2), (2, 7, 16))
  fused = models.MultiHeadDotProductAttention(num_heads=4)
  plain = fused.clone(implementation='plain')
  variables = fused.init(jax.random.key(0), x, y)
  assert jax.tree.structure(variables) == jax.tree.structure(plain.init(jax.random.key(0), x, y))
  mask = attention.make_padding_mask(jnp.ones((2, 5)), jnp.array([[1] * 7, [1] * 4 + [0] * 3]))
  out_fused = fused.apply(variables, x, y, mask=mask)
  out_plain, weights = plain.apply(variables, x, y, mask=mask, return_weights=True)
  assert out_fused.shape == (2, 5, 16) and weights.shape == (2, 4, 5, 7)
  np.testing.assert_allclose(out_fused, out_plain, atol=1e-5)
  np.testing.assert_allclose(weights[1, :, :, 4:], 0.0, atol=1e-30)


@pytest.mark.parametrize('mask_name', ['none', 'padding', 'causal', 'padding+causal'])
def test_auto_equals_plain_in_values_and_gradients(mask_name):
  x = jax.random.normal(jax.random.key(1), (2, 6, 24))
  mask = _masks(6, 6)[mask_name]
  auto = models.MultiHeadDotProductAttention(num_heads=3)
  plain = auto.clone(implementation='plain')
  variables = auto.init(jax.random.key(0), x)
  probe = jax.random.normal(jax.random.key(2), x.shape)  # An output cotangent.

  def value_and_grads(layer):
    loss = lambda v, x: jnp.sum(layer.apply(v, x, mask=mask) * probe)  # noqa: E731
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(variables, x)

  (auto_loss, auto_grads), (plain_loss, plain_grads) = map(value_and_grads, (auto, plain))
  np.testing.assert_allclose(auto_loss, plain_loss, rtol=1e-5)
  np.testing.assert_allclose(auto.apply(variables, x, mask=mask),
                             plain.apply(variables, x, mask=mask), atol=1e-5, rtol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0),
               auto_grads, plain_grads)


def test_auto_resolves_per_backend_and_dtype():
  resolve = attention.resolve_attention_impl
  # float32 on CPUs: the BLAS kernel where `kernels.use` puts the Dense layers there, and on
  # AMD CPUs with MKL (test_blas checks each CPU and BLAS).
  on_blas = blas.attention_on_blas('auto')
  with kernels.use('auto'):
    assert resolve('auto', backend='cpu') == ('blas' if on_blas else 'head_major')
  with kernels.use('xla'):
    assert resolve('auto', backend='cpu') == 'head_major'
  assert resolve('auto', backend='cpu') == 'head_major'  # Plain Flax: no `kernels.use`.
  assert resolve('auto', backend='cpu', dtype=jnp.bfloat16) == 'head_major'
  assert resolve('auto', backend='gpu', dtype=jnp.bfloat16) == 'cudnn'
  assert resolve('auto', backend='gpu', dtype=jnp.float16) == 'cudnn'
  assert resolve('auto', backend='gpu', dtype=jnp.float32) == 'fused'
  assert resolve('auto', backend='tpu', dtype=jnp.bfloat16) == 'fused'
  assert resolve('auto') == resolve('auto', backend=jax.default_backend())
  for explicit in ('fused', 'plain', 'chunked', 'blas'):
    assert resolve(explicit, backend='gpu', dtype=jnp.bfloat16) == explicit


def test_target_backend_chooses_for_a_device_that_is_not_here():
  """Compiling for a GPU from a CPU (`benchmark --compile-for`): 'auto' picks the GPU's."""
  resolve = attention.resolve_attention_impl
  with backend.target_backend('gpu'):
    assert resolve('auto', dtype=jnp.bfloat16) == 'cudnn'
    assert resolve('auto', dtype=jnp.float32) == 'fused'
    assert resolve('auto', backend='cpu', dtype=jnp.bfloat16) == 'head_major'
    assert attention.padded_length('auto', 197, dtype=jnp.bfloat16) == 198
  assert resolve('auto', dtype=jnp.bfloat16) == resolve('auto', backend=jax.default_backend(),
                                                        dtype=jnp.bfloat16)


def test_padded_length_follows_the_kernel():
  """cuDNN's gradient needs even lengths; the other kernels take any."""
  with backend.target_backend('gpu'):  # 'auto' is cuDNN for bfloat16, XLA for float32.
    assert [attention.padded_length('auto', n, dtype=jnp.bfloat16)
            for n in (1, 196, 197)] == [2, 196, 198]
    assert attention.padded_length('auto', 197, dtype=jnp.float32) == 197
  for name in ('auto', 'fused', 'plain', 'chunked'):
    assert attention.padded_length(name, 197) == 197


@pytest.mark.parametrize('kernel,stack', [('even_only', {}), ('fused', {}),
                                          ('fused', {'scan_layers': True, 'remat': True})])
def test_encoder_pads_once_for_a_kernel_that_wants_even_lengths(monkeypatch, kernel, stack):
  """A ViT of 17 tokens on a kernel of even lengths: every layer sees 18 tokens, the
  padding hidden (from a registered kernel by a boolean mask of the real keys, from
  `fused_attention` by key lengths, as cuDNN takes them, also through a scanned and
  rematerialised stack), and logits and gradients equal those without padding."""
  seen = []

  def even_only(query, key, value, mask):
    seen.append((query.shape[1], key.shape[1], None if mask is None else mask.shape))
    return attention.fused_attention(query, key, value, mask)

  def spied_attention(query, key, value, mask=None, **kwargs):
    lengths = kwargs.get('key_value_seq_lengths')
    seen.append((query.shape[1], key.shape[1], mask, None if lengths is None else lengths.shape))
    return dot_product_attention(query, key, value, mask=mask, **kwargs)

  monkeypatch.setattr(attention, 'ATTENTION_IMPLEMENTATIONS',
                      list(attention.ATTENTION_IMPLEMENTATIONS))
  monkeypatch.setattr(attention, 'KERNELS', dict(attention.KERNELS))
  monkeypatch.setattr(attention, '_LENGTH_MULTIPLES', dict(attention._LENGTH_MULTIPLES))
  if kernel == 'even_only':
    attention.register_kernel('even_only', even_only, length_multiple=2)
    expected = {(18, 18, (1, 1, 1, 18))}
  else:
    attention._LENGTH_MULTIPLES['fused'] = 2
    dot_product_attention = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, 'dot_product_attention', spied_attention)
    expected = {(18, 18, None, (2,))}  # Lengths of the batch's 2 examples.
  images = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))  # 4x4 patches + class token.
  labels = jnp.array([1, 3])
  padded = models.get_model('ViT-testing', num_classes=5, attention_impl=kernel, **stack)
  plain = padded.clone(attention_impl='chunked')
  params = jax.jit(plain.init)(jax.random.key(1), images)['params']
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)

  def loss(model, params):
    logits = model.apply({'params': params}, images)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1).mean(), logits

  (padded_loss, padded_logits), padded_grads = jax.jit(jax.value_and_grad(
      lambda p: loss(padded, p), has_aux=True))(params)
  (plain_loss, plain_logits), plain_grads = jax.jit(jax.value_and_grad(
      lambda p: loss(plain, p), has_aux=True))(params)
  assert set(seen) == expected
  np.testing.assert_allclose(padded_logits, plain_logits, atol=1e-5, rtol=0)
  # The loss (a mean of log-softmaxes) moves at most twice the logits' largest difference.
  np.testing.assert_allclose(padded_loss, plain_loss, atol=2e-5, rtol=0)
  # Padding changes the matrices' shapes, so the kernels sum in another order, which differs
  # with the CPU's vector width: the gradient as a whole differs in its last float32 bits (about
  # 1e-6 of its norm; single elements by more, the key biases' analytically zero gradients are
  # all rounding). A padded key that leaked into the softmax moves it by several percent.
  padded_flat, plain_flat = (jax.flatten_util.ravel_pytree(g)[0] for g in (padded_grads,
                                                                           plain_grads))
  difference = np.linalg.norm(padded_flat - plain_flat) / np.linalg.norm(plain_flat)
  assert difference < 1e-5, difference


def test_key_padding_is_a_mask_of_the_real_keys_on_every_path():
  """`KeyPadding(5)` of 7 keys: the fused and plain paths, causal attention and the
  returned weights treat it as the boolean mask of the first 5 keys."""
  x = jax.random.normal(jax.random.key(0), (2, 7, 8))
  padding = attention.KeyPadding(5)
  boolean = padding.as_mask(7)
  assert boolean.shape == (1, 1, 1, 7) and boolean.tolist()[0][0][0] == [True] * 5 + [False] * 2
  for implementation in ('fused', 'plain', 'chunked'):
    layer = models.MultiHeadDotProductAttention(num_heads=2, implementation=implementation)
    variables = layer.init(jax.random.key(1), x)
    for causal in (False, True):
      np.testing.assert_allclose(
          layer.apply(variables, x, mask=padding, causal=causal),
          layer.apply(variables, x, mask=boolean, causal=causal), atol=1e-6, rtol=0)
    _, weights = layer.apply(variables, x, mask=padding, return_weights=True)
    assert float(jnp.abs(weights[..., 5:]).max()) == 0.0


def test_unknown_implementation_lists_the_valid_ones():
  layer = models.MultiHeadDotProductAttention(num_heads=2, implementation='flash')
  with pytest.raises(ValueError, match=r"'flash'.*'auto', 'fused', 'plain', 'chunked'"):
    layer.init(jax.random.key(0), jnp.zeros((1, 3, 8)))


@pytest.mark.parametrize('lengths,mask_name', [((6, 6), 'none'), ((5, 7), 'none'),
                                                ((5, 7), 'padding')])
def test_cudnn_request_runs_anywhere_and_differentiates(lengths, mask_name):
  """cuDNN where it can run the inputs (unmasked odd lengths padded to even); XLA
  without cuDNN (CPUs) and for masked odd lengths. Differentiated under
  `jax.checkpoint`, so that cuDNN's gradient rule runs outside the call."""
  t, s = lengths
  q, k, v = (x.astype(jnp.bfloat16) for x in _random_qkv(t, s))
  mask = _masks(t, s)[mask_name]
  weights = jax.random.normal(jax.random.key(1), q.shape)

  def loss(attend):
    return jax.checkpoint(
        lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32) * weights))

  fused = loss(lambda q, k, v: attention.fused_attention(q, k, v, mask, cudnn=True))
  plain = loss(lambda q, k, v: attention.plain_attention(q, k, v, mask)[0])
  out = attention.fused_attention(q, k, v, mask, cudnn=True)
  reference = attention.plain_attention(q, k, v, mask)[0]
  np.testing.assert_allclose(out.astype(jnp.float32), reference.astype(jnp.float32), atol=2e-2)
  grads = jax.jit(jax.grad(fused, argnums=(0, 1, 2)))(q, k, v)
  reference_grads = jax.jit(jax.grad(plain, argnums=(0, 1, 2)))(q, k, v)
  for grad, reference_grad in zip(grads, reference_grads):
    scale = float(jnp.abs(reference_grad.astype(jnp.float32)).max())
    np.testing.assert_allclose(grad.astype(jnp.float32), reference_grad.astype(jnp.float32),
                               atol=3e-2 * scale)


def test_parameter_shapes_follow_published_layout():
  x = jnp.zeros((1, 3, 768))
  shapes = jax.tree.map(jnp.shape, models.MultiHeadDotProductAttention(num_heads=12).init(
      jax.random.key(0), x)['params'])
  assert shapes['query'] == {'kernel': (768, 12, 64), 'bias': (12, 64)}
  assert shapes['out'] == {'kernel': (12, 64, 768), 'bias': (768,)}


def test_causal_self_attention_never_looks_ahead():
  layer = models.MultiHeadDotProductAttention(num_heads=2)
  x = jax.random.normal(jax.random.key(0), (1, 6, 8))
  variables = layer.init(jax.random.key(1), x)
  t = 3
  x_changed = x.at[:, t].add(1.0)
  out = layer.apply(variables, x, causal=True)
  out_changed = layer.apply(variables, x_changed, causal=True)
  np.testing.assert_array_equal(out[:, :t], out_changed[:, :t])
  assert float(jnp.abs(out[:, t:] - out_changed[:, t:]).min()) > 0


def test_attention_dropout_only_in_training():
  layer = models.MultiHeadDotProductAttention(num_heads=2, dropout_rate=0.5)
  x = jax.random.normal(jax.random.key(0), (2, 6, 8))
  variables = layer.init(jax.random.key(1), x)
  eval_out = layer.apply(variables, x)
  np.testing.assert_array_equal(eval_out, layer.apply(variables, x))
  train_out = layer.apply(variables, x, deterministic=False,
                          rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(train_out, eval_out)


def test_attention_dropout_on_another_kernel_says_it_runs_plain(caplog, monkeypatch):
  monkeypatch.setattr(attention, 'DROPOUT_NOTED', set())  # Said once per process.
  layer = models.MultiHeadDotProductAttention(num_heads=2, dropout_rate=0.5,
                                              implementation='chunked')
  x = jax.random.normal(jax.random.key(0), (2, 6, 8))
  variables = layer.init(jax.random.key(1), x)
  with caplog.at_level('WARNING'):
    layer.apply(variables, x, deterministic=False, rngs={'dropout': jax.random.key(2)})
  assert "runs on the plain attention path in training: 'chunked' has no dropout" in caplog.text


def test_hidden_size_not_divisible_by_heads_is_a_clear_error():
  layer = models.MultiHeadDotProductAttention(num_heads=5)
  with pytest.raises(ValueError, match='not divisible by num_heads=5'):
    layer.init(jax.random.key(0), jnp.zeros((1, 3, 12)))
  with pytest.raises(ValueError, match='hidden_size=100 is not divisible by num_heads=12'):
    models.get_model('ViT-B_16', num_classes=10, hidden_size=100).init(
        jax.random.key(0), jnp.zeros((1, 32, 32, 3)))


@pytest.mark.parametrize('position_embedding', ['none', 'learned', 'sinusoidal'])
def test_order_blindness_without_position_encoding(position_embedding):
  encoder = models.Encoder(num_layers=2, mlp_dim=32, num_heads=2,
                           position_embedding=position_embedding)
  x = jax.random.normal(jax.random.key(0), (2, 7, 16))
  variables = encoder.init(jax.random.key(1), x)
  permutation = jax.random.permutation(jax.random.key(2), 7)
  out = encoder.apply(variables, x)
  out_of_permuted = encoder.apply(variables, x[:, permutation])
  if position_embedding == 'none':
    np.testing.assert_allclose(out_of_permuted, out[:, permutation], atol=1e-5)
  else:
    assert float(jnp.abs(out_of_permuted - out[:, permutation]).max()) > 1e-3


def test_sinusoidal_encoding_follows_the_paper():
  table = models.sinusoidal_1d(50, 16)
  pos, i = 7, 3
  np.testing.assert_allclose(table[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)), atol=1e-6)
  np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)),
                             atol=1e-6)
  np.testing.assert_array_equal(table[0, 0::2], 0.0)
  np.testing.assert_array_equal(table[0, 1::2], 1.0)


def test_sincos_2d_encodes_rows_and_columns():
  table = models.sincos_2d(4, 5, 32)
  assert table.shape == (20, 32)
  assert len({tuple(np.round(row, 6)) for row in table}) == 20  # Every patch distinct.
  grid = table.reshape(4, 5, 32)
  np.testing.assert_allclose(grid[:, 0, :16], grid[:, 3, :16])  # y half ignores x.
  np.testing.assert_allclose(grid[0, :, 16:], grid[2, :, 16:])  # x half ignores y.
