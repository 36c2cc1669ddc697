"""Seq2seq Transformer: masks, causality, cached decoding, embeddings, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import cached_teacher_forced_logits

from vit_jax import models
from vit_jax.flops import count_flops

VOCAB = 23


@pytest.fixture(scope='module')
def setup():
  model = models.get_model('Transformer-testing', vocab_size=VOCAB)
  inputs = jnp.array([[5, 6, 7, 8, 9, 0], [3, 4, 0, 0, 0, 0]])
  targets = jnp.array([[11, 12, 13, 14, 15, 16, 17], [3, 9, 9, 4, 2, 8, 1]])
  variables = model.init(jax.random.key(0), inputs, targets)
  return model, variables, inputs, targets


def test_forward_shapes_and_parameters(setup):
  model, variables, inputs, targets = setup
  logits = model.apply(variables, inputs, targets)
  assert logits.shape == (2, 7, VOCAB) and logits.dtype == jnp.float32
  params = variables['params']
  assert set(params) == {'shared_embedding', 'encoder', 'decoder'}
  assert set(params['decoder']['decoderblock_0']) == {
      'SelfAttention', 'CrossAttention', 'MlpBlock', 'LayerNorm_0', 'LayerNorm_1',
      'LayerNorm_2'}
  assert 'encoder_norm' not in params['encoder']  # Post-LN blocks end in a LayerNorm.


def test_changing_target_t_changes_no_output_before_t(setup):
  model, variables, inputs, targets = setup
  logits = model.apply(variables, inputs, targets)
  t = 3
  changed = model.apply(variables, inputs, targets.at[:, t].set(20))
  # Logits at position p predict target p from targets < p: positions <= t see no change.
  np.testing.assert_array_equal(logits[:, :t + 1], changed[:, :t + 1])
  assert float(jnp.abs(logits[:, t + 1:] - changed[:, t + 1:]).min()) > 0


def test_source_padding_is_ignored(setup):
  model, variables, inputs, targets = setup
  logits = model.apply(variables, inputs, targets)
  longer = jnp.pad(inputs, ((0, 0), (0, 3)))  # More padding changes nothing.
  np.testing.assert_allclose(model.apply(variables, longer, targets), logits, atol=1e-5)


@pytest.mark.parametrize('attention_impl', ['auto', 'fused', 'plain'])
def test_cached_decoding_reproduces_full_forward(setup, attention_impl):
  model, variables, inputs, targets = setup
  model = model.clone(attention_impl=attention_impl)
  full = model.apply(variables, inputs, targets)
  steps = cached_teacher_forced_logits(model, variables['params'], inputs, targets)
  np.testing.assert_allclose(steps, full, atol=1e-5, rtol=0)


def test_cached_decoding_projects_the_encoder_output_once(setup):
  model, variables, inputs, targets = setup
  params = variables['params']
  decoder = model.clone(cached_decoding=True)
  cache = decoder.init(jax.random.key(0), inputs, targets)['cache']
  encoded = model.apply(variables, inputs, method='encode')

  def step(cache, encoded, token):
    logits, updated = decoder.apply({'params': params, 'cache': cache}, encoded, inputs,
                                    token, method='decode', mutable=['cache'])
    return logits, updated['cache']

  start, token = jnp.zeros((2, 1), jnp.int32), targets[:, :1]
  assert 'CrossAttention' not in cache['decoder']['decoderblock_0']  # init stores none.
  _, filled = step(cache, encoded, start)  # The first step stores the projections.
  for i in range(model.num_layers):
    stored = filled['decoder'][f'decoderblock_{i}']['CrossAttention']
    weights = params['decoder'][f'decoderblock_{i}']['CrossAttention']
    for name in ('key', 'value'):
      projected = (jnp.einsum('bsd,dnh->bsnh', encoded, weights[name]['kernel'])
                   + weights[name]['bias'])
      np.testing.assert_allclose(stored[f'cross_{name}'], projected, atol=1e-5)
  # Later steps read them: the encoder output does not enter them any more ...
  logits, _ = step(filled, encoded, token)
  np.testing.assert_array_equal(step(filled, jnp.zeros_like(encoded), token)[0], logits)
  # ... and skip the key and value projections (B*S*D*D multiply-adds each) per layer.
  batch, length, width = encoded.shape
  first, later = count_flops(step, cache, encoded, start), count_flops(step, filled, encoded, token)
  assert first - later == model.num_layers * 2 * batch * length * width * width


def test_cached_decoding_rejects_more_than_one_token(setup):
  model, variables, inputs, targets = setup
  decoder = model.clone(cached_decoding=True)
  cache = decoder.init(jax.random.key(0), inputs, targets)['cache']
  encoded = model.apply(variables, inputs, method='encode')
  with pytest.raises(ValueError, match='one token per call'):
    decoder.apply({'params': variables['params'], 'cache': cache}, encoded, inputs,
                  targets[:, :2], method='decode', mutable=['cache'])


def test_separate_embeddings_and_output_layer():
  model = models.get_model('Transformer-testing', vocab_size=30, output_vocab_size=17,
                           share_embeddings=False, logits_via_embedding=False)
  inputs, targets = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32)
  variables = jax.jit(model.init)(jax.random.key(0), inputs, targets)
  params = variables['params']
  assert params['source_embedding']['embedding'].shape == (30, 32)
  assert params['target_embedding']['embedding'].shape == (17, 32)
  assert params['decoder']['logits']['kernel'].shape == (32, 17)
  assert jax.jit(model.apply)(variables, inputs, targets).shape == (2, 4, 17)
  with pytest.raises(ValueError, match='share_embeddings=True needs one vocabulary'):
    models.get_model('Transformer-testing', vocab_size=30, output_vocab_size=17).init(
        jax.random.key(0), inputs, targets)


def test_pre_norm_variant_and_dropout_in_training(setup):
  _, _, inputs, targets = setup
  model = models.get_model('Transformer-testing', vocab_size=VOCAB, norm_position='pre')
  variables = model.init(jax.random.key(0), inputs, targets)
  assert 'encoder_norm' in variables['params']['encoder']
  assert 'decoder_norm' in variables['params']['decoder']
  eval_logits = model.apply(variables, inputs, targets)
  train_logits = model.apply(variables, inputs, targets, train=True,
                             rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(train_logits, eval_logits)


def test_bfloat16_compute(setup):
  model, variables, inputs, targets = setup
  reference = jax.jit(model.apply)(variables, inputs, targets)
  out = jax.jit(model.clone(dtype=jnp.bfloat16).apply)(variables, inputs, targets)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, reference, atol=0.05 * float(jnp.abs(reference).max()))


def test_paper_sizes():
  base = models.get_model('Transformer-base', vocab_size=32000)
  big = models.get_model('Transformer-big', vocab_size=32000)
  assert (base.embed_dim, base.mlp_dim, base.num_heads, base.num_layers,
          base.dropout_rate) == (512, 2048, 8, 6, 0.1)
  assert (big.embed_dim, big.mlp_dim, big.num_heads, big.dropout_rate) == (1024, 4096, 16, 0.3)
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda a, b: base.init(jax.random.key(0), a, b), tokens, tokens)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  # Shared 32000x512 embedding + 6 encoder layers (3.15M each) + 6 decoder layers (4.20M each).
  assert count == 32000 * 512 + 6 * 3_152_384 + 6 * 4_204_032


def test_token_inputs_are_checked(setup):
  model, variables, inputs, targets = setup
  with pytest.raises(ValueError, match='integer token ids of shape'):
    model.apply(variables, inputs.astype(jnp.float32), targets)
  # An id past the vocabulary embedded as NaN logits (a negative one as another token).
  with pytest.raises(ValueError, match=rf'inputs holds token id {VOCAB}, outside the vocabulary '
                                       rf'of {VOCAB} ids \(0 to {VOCAB - 1}\); check the '
                                       "tokenizer against the model's vocab_size"):
    model.apply(variables, inputs.at[0, 0].set(VOCAB), targets)
  with pytest.raises(ValueError, match='targets holds token id -1, outside the vocabulary'):
    model.apply(variables, inputs, targets.at[1, 2].set(-1))
  with pytest.raises(ValueError, match=r'inputs and targets must hold the same number of '
                                       r'sequences, got shapes \(1, 6\) and \(2, 7\)'):
    model.apply(variables, inputs[:1], targets)
  # Under jit the ids are not known: no check, nothing traced for one.
  assert jax.jit(model.apply)(variables, inputs, targets).shape == (2, 7, VOCAB)


def test_packed_rows_equal_separate_examples(setup):
  model, variables, _, _ = setup
  first = (jnp.array([[5, 6, 7]]), jnp.array([[11, 12, 13, 1]]))
  second = (jnp.array([[8, 9]]), jnp.array([[14, 15, 1]]))
  apply = jax.jit(model.apply)  # Eagerly, each new shape compiles every operation anew.
  separate = [apply(variables, inputs, targets) for inputs, targets in (first, second)]
  packed = apply(
      variables, jnp.array([[5, 6, 7, 8, 9, 0]]), jnp.array([[11, 12, 13, 1, 14, 15, 1, 0]]),
      inputs_segmentation=jnp.array([[1, 1, 1, 2, 2, 0]]),
      targets_segmentation=jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]]),
      inputs_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
      targets_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]]))
  np.testing.assert_allclose(packed[0, :4], separate[0][0], atol=1e-5)
  np.testing.assert_allclose(packed[0, 4:7], separate[1][0], atol=1e-5)
