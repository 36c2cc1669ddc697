"""count_flops against hand-counted attention costs (batch 32, 1024 tokens, width 512;
one FLOP per multiply-add, as fvcore counts)."""

import jax
import jax.numpy as jnp

from vit_jax import models
from vit_jax.flops import count_flops

INPUTS = jax.ShapeDtypeStruct((32, 1024, 512), jnp.float32)  # (batch, tokens, width)


def _attention_without_output_projection(num_heads):
  """q/k/v from one fused bias-free linear layer, attention per head, no W^o."""
  def fn(x):
    qkv = x @ jnp.zeros((512, 3 * 512))  # (B, T, 3D)
    q, k, v = (y.reshape(32, 1024, num_heads, 512 // num_heads)  # (B, T, N, H)
               for y in jnp.split(qkv, 3, axis=-1))
    return models.plain_attention(q, k, v)[0]
  return fn


def test_single_head_attention_flops():
  assert count_flops(_attention_without_output_projection(1), INPUTS) == 60_129_542_144


def test_head_split_costs_nothing():
  assert count_flops(_attention_without_output_projection(8), INPUTS) == 60_129_542_144


def test_eight_heads_with_output_projection():
  layer = models.MultiHeadDotProductAttention(num_heads=8, use_bias=False)
  params = jax.eval_shape(layer.init, jax.random.key(0), INPUTS)
  assert count_flops(layer.apply, params, INPUTS) == 68_719_476_736
  fused_and_plain = {count_flops(layer.clone(implementation=impl).apply, params, INPUTS)
                     for impl in ('fused', 'plain')}
  assert fused_and_plain == {68_719_476_736}


def test_convolutions_scans_and_gradients_are_counted():
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  model = models.get_model('ViT-testing', num_classes=10)
  params = jax.eval_shape(model.init, jax.random.key(0), images)
  forward = count_flops(model.apply, params, images)
  tokens = 1 + 8 * 8
  patch_embedding = 2 * 64 * (4 * 4 * 3) * 32
  per_block = 2 * (4 * tokens * 32 * 32 + 2 * tokens * tokens * 32 + 2 * tokens * 32 * 64)
  head = 2 * 32 * 10
  assert forward == patch_embedding + 2 * per_block + head
  scanned = model.clone(scan_layers=True)
  scanned_params = jax.eval_shape(scanned.init, jax.random.key(0), images)
  assert count_flops(scanned.apply, scanned_params, images) == forward
  loss = lambda p, x: jnp.sum(model.apply(p, x))  # noqa: E731
  assert count_flops(jax.grad(loss), params, images) > 2 * forward


def test_cudnn_attention_counts_like_xla(monkeypatch):
  """cuDNN's attention primitives count as XLA's attention, forward and backward.

  Traced only (nothing runs), with JAX's cuDNN checks told that a Hopper GPU is
  there, so that CPUs trace the primitives a GPU would run.
  """
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cudnn, 'check_cudnn_version', lambda: 91000)
  monkeypatch.setattr(cudnn, 'check_compute_capability', lambda capability: True)
  monkeypatch.setattr(cudnn, 'is_cuda_compute_capability_equal', lambda capability: False)
  from vit_jax.models import attention  # pylint: disable=g-import-not-at-top
  query = jax.ShapeDtypeStruct((2, 5, 3, 8), jnp.bfloat16)  # Odd lengths: padded.
  key = jax.ShapeDtypeStruct((2, 7, 3, 8), jnp.bfloat16)

  def loss(cudnn_on):
    return lambda q, k, v: jnp.sum(attention.fused_attention(q, k, v, cudnn=cudnn_on))

  primitives = str(jax.make_jaxpr(jax.grad(loss(True)))(query, key, key))
  assert 'dot_product_attention_fwd' in primitives and 'dot_product_attention_bwd' in primitives
  padded_forward = 2 * 2 * 3 * 6 * 8 * 8  # (B, N) pairs, T and S rounded up to even, H.
  assert count_flops(loss(True), query, key, key) == padded_forward
  grads = (jax.grad(loss(True), argnums=(0, 1, 2)), jax.grad(loss(False), argnums=(0, 1, 2)))
  assert count_flops(grads[0], query, key, key) == 3 * padded_forward
  assert count_flops(grads[1], query, key, key) == 3 * 2 * 2 * 3 * 5 * 7 * 8
