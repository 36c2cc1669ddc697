"""Sequence-to-sequence Transformer (Vaswani et al. 2017, "Attention Is All You Need").

Data flow: source tokens (B, S) -> embedding * sqrt(D) + sinusoidal positions ->
encoder blocks -> encoded (B, S, D). Target tokens (B, T), shifted right ->
embedding + positions -> decoder blocks (causal self-attention, cross-attention
to the encoder output, MLP) -> logits (B, T, V). Token id 0 is padding, and
also the start-of-sequence token fed to the decoder's first position.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.masks import combine_masks, make_padding_mask, make_segment_mask
from vit_jax.models.layers import NORM_POSITIONS, Encoder, MlpBlock
from vit_jax.models.position import AddSinusoidalPositions

Array = jax.Array
Dtype = Any


def shift_right(targets: Array, segmentation: Array | None = None) -> Array:
  """(B, T) -> (B, T): prepend the start token 0 and drop the last token.

  With packed rows (`segmentation`), every example starts with the token 0.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segmentation is not None:
    starts = segmentation != jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(starts, 0, shifted)
  return shifted


class DecoderBlock(nn.Module):
  """Causal self-attention, cross-attention to the encoder, MLP; each residual."""
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  norm_position: str = 'post'
  activation: str = 'relu'
  attention_impl: str = 'auto'
  decode: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, targets: Array, encoded: Array, *, self_mask: Array | None,
               cross_mask: Array | None, deterministic: bool) -> Array:
    pre_norm = self.norm_position == 'pre'

    def sublayer(x, index, branch):
      norm = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype,
                          name=f'LayerNorm_{index}')
      y = branch(norm(x) if pre_norm else x)
      y = x + nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
      return y if pre_norm else norm(y)

    attention = lambda name, **kw: MultiHeadDotProductAttention(  # noqa: E731
        num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
        implementation=self.attention_impl, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name, **kw)
    x = sublayer(targets, 0, lambda y: attention('SelfAttention', decode=self.decode)(
        y, mask=self_mask, causal=True, deterministic=deterministic))
    x = sublayer(x, 1, lambda y: attention('CrossAttention', decode=self.decode)(
        y, encoded, mask=cross_mask, deterministic=deterministic))
    # MlpBlock applies dropout to its own output; `sublayer` adds none on top.
    mlp = MlpBlock(self.mlp_dim, dropout_rate=0.0, activation=self.activation,
                   dtype=self.dtype, param_dtype=self.param_dtype,
                   name='MlpBlock')
    return sublayer(x, 2, lambda y: mlp(y, deterministic=deterministic))


class Decoder(nn.Module):
  """Target embedding + positions, `num_layers` DecoderBlocks, output logits."""
  embedding: nn.Embed
  num_layers: int
  mlp_dim: int
  num_heads: int
  output_vocab_size: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  norm_position: str = 'post'
  activation: str = 'relu'
  attention_impl: str = 'auto'
  logits_via_embedding: bool = True
  max_length: int = 2048
  decode: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, encoded: Array, targets: Array, *, self_mask: Array | None,
               cross_mask: Array | None, segmentation: Array | None = None,
               positions: Array | None = None, train: bool) -> Array:
    width = self.embedding.features
    y = targets if self.decode else shift_right(targets, segmentation)
    y = self.embedding(y) * jnp.sqrt(jnp.asarray(width, self.dtype))  # (B, T, D)
    y = AddSinusoidalPositions(max_length=self.max_length, decode=self.decode)(y, positions)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    for i in range(self.num_layers):
      y = DecoderBlock(
          mlp_dim=self.mlp_dim, num_heads=self.num_heads,
          dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate,
          norm_position=self.norm_position, activation=self.activation,
          attention_impl=self.attention_impl, decode=self.decode, dtype=self.dtype,
          param_dtype=self.param_dtype, name=f'decoderblock_{i}')(
              y, encoded, self_mask=self_mask, cross_mask=cross_mask,
              deterministic=not train)
    if self.norm_position == 'pre':
      y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype,
                       name='decoder_norm')(y)
    if self.logits_via_embedding:
      logits = self.embedding.attend(y)
    else:
      logits = nn.Dense(self.output_vocab_size, dtype=self.dtype,
                        param_dtype=self.param_dtype, name='logits')(y)
    return logits.astype(jnp.float32)  # (B, T, V)


class Transformer(nn.Module):
  """Encoder-decoder Transformer; `__call__(inputs, targets)` gives logits (B, T, V).

  For autoregressive decoding use `model.clone(cached_decoding=True)`: initialise its
  'cache' collection with `init(rng, inputs, targets)` where `targets` has the
  maximum output length, then call `decode` one target token (B, 1) at a time
  with `mutable=['cache']`; feed token 0 first. The first call also stores the
  cross-attention keys/values of `encoded` in the cache, which later calls reuse:
  a loop that carries the cache (`jax.lax.while_loop`, `scan`) starts after it.
  """
  vocab_size: int
  output_vocab_size: int | None = None  # Target vocabulary; default: vocab_size.
  share_embeddings: bool = True  # One embedding table for source and target.
  logits_via_embedding: bool = True  # Output projection = target embedding^T.
  embed_dim: int = 512
  num_layers: int = 6  # Encoder layers; the decoder has as many.
  mlp_dim: int = 2048
  num_heads: int = 8
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  norm_position: str = 'post'  # 'post' (paper) or 'pre' (more stable when deep).
  activation: str = 'relu'
  attention_impl: str = 'auto'  # 'auto' or a kernel of attention.KERNELS.
  max_length: int = 2048  # Longest sequence the sinusoidal positions cover.
  cached_decoding: bool = False  # One target token per `decode` call, with a k/v cache.
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def setup(self):
    if self.embed_dim % self.num_heads:
      raise errors.ConfigError(f'embed_dim={self.embed_dim} is not divisible by '
                               f'num_heads={self.num_heads}.')
    if self.norm_position not in NORM_POSITIONS:
      raise errors.ConfigError(f'Unknown norm_position {self.norm_position!r}; '
                               f'choose one of {NORM_POSITIONS}.')
    target_vocab = self.output_vocab_size or self.vocab_size
    if self.share_embeddings and target_vocab != self.vocab_size:
      raise errors.ConfigError(f'share_embeddings=True needs one vocabulary, got vocab_size='
                               f'{self.vocab_size} and output_vocab_size={target_vocab}.')
    embed = lambda vocab, name: nn.Embed(  # noqa: E731
        vocab, self.embed_dim, dtype=self.dtype, param_dtype=self.param_dtype,
        embedding_init=nn.initializers.normal(stddev=self.embed_dim**-0.5), name=name)
    if self.share_embeddings:
      self.source_embedding = self.target_embedding = embed(self.vocab_size,
                                                           'shared_embedding')
    else:
      self.source_embedding = embed(self.vocab_size, 'source_embedding')
      self.target_embedding = embed(target_vocab, 'target_embedding')
    self.encoder = Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        position_embedding='sinusoidal', norm_position=self.norm_position,
        activation=self.activation, attention_impl=self.attention_impl,
        max_length=self.max_length, dtype=self.dtype,
        param_dtype=self.param_dtype)
    self.decoder = Decoder(
        embedding=self.target_embedding, num_layers=self.num_layers,
        mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        output_vocab_size=target_vocab, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        norm_position=self.norm_position, activation=self.activation,
        attention_impl=self.attention_impl,
        logits_via_embedding=self.logits_via_embedding, max_length=self.max_length,
        decode=self.cached_decoding, dtype=self.dtype, param_dtype=self.param_dtype)

  def encode(self, inputs: Array, *, inputs_segmentation: Array | None = None,
             inputs_positions: Array | None = None, train: bool = False) -> Array:
    """Source tokens (B, S) -> encoded (B, S, D); padding (id 0) is masked.

    Packed rows pass `inputs_segmentation` (1, 2, ... per example) and
    `inputs_positions`; tokens then attend within their own example only.
    """
    _check_tokens('inputs', inputs, self.vocab_size)
    x = self.source_embedding(inputs) * jnp.sqrt(jnp.asarray(self.embed_dim, self.dtype))
    valid = inputs > 0
    mask = make_padding_mask(valid, valid)
    if inputs_segmentation is not None:
      mask = combine_masks(mask, make_segment_mask(inputs_segmentation, inputs_segmentation))
    return self.encoder(x, mask=mask, positions=inputs_positions, train=train)

  def decode(self, encoded: Array, inputs: Array, targets: Array, *,
             inputs_segmentation: Array | None = None,
             targets_segmentation: Array | None = None,
             targets_positions: Array | None = None, train: bool = False) -> Array:
    """Target tokens (B, T) -> logits (B, T, V), attending to `encoded`.

    Normally `targets` are the full (unshifted) targets; the decoder shifts
    them right itself. With `cached_decoding`, `targets` is the previous token
    (B, 1) and the position advances with each call.
    """
    _check_tokens('targets', targets, self.output_vocab_size or self.vocab_size)
    if self.cached_decoding:
      self_mask = None  # The cache hides the future positions.
      query_valid = jnp.ones(targets.shape, bool)
    else:
      query_valid = targets > 0
      self_mask = make_padding_mask(query_valid, query_valid)
    cross_mask = make_padding_mask(query_valid, inputs > 0)
    if targets_segmentation is not None:
      self_mask = combine_masks(self_mask,
                                make_segment_mask(targets_segmentation, targets_segmentation))
      cross_mask = combine_masks(cross_mask,
                                 make_segment_mask(targets_segmentation, inputs_segmentation))
    return self.decoder(encoded, targets, self_mask=self_mask, cross_mask=cross_mask,
                        segmentation=targets_segmentation, positions=targets_positions,
                        train=train)

  def __call__(self, inputs: Array, targets: Array, *,
               inputs_segmentation: Array | None = None,
               targets_segmentation: Array | None = None,
               inputs_positions: Array | None = None,
               targets_positions: Array | None = None, train: bool = False) -> Array:
    """Teacher-forced logits (B, T, V) for `targets` given `inputs`."""
    if inputs.shape[:1] != targets.shape[:1]:
      raise ValueError(f'inputs and targets must hold the same number of sequences, got shapes '
                       f'{inputs.shape} and {targets.shape}.')
    encoded = self.encode(inputs, inputs_segmentation=inputs_segmentation,
                          inputs_positions=inputs_positions, train=train)
    return self.decode(encoded, inputs, targets, inputs_segmentation=inputs_segmentation,
                       targets_segmentation=targets_segmentation,
                       targets_positions=targets_positions, train=train)


def _check_tokens(name: str, tokens: Array, vocab_size: int):
  """Shape and dtype always; the ids' range where they are known (outside jit): an id out of
  range would embed as NaN, or wrap round to another token, without a word."""
  if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f'{name} must be integer token ids of shape (batch, length), got '
                     f'{tokens.dtype} array of shape {tokens.shape}.')
  if isinstance(tokens, jax.core.Tracer) or not tokens.size:
    return
  values = np.asarray(tokens)  # On the host: under a trace, jnp ops would be traced.
  low, high = int(values.min()), int(values.max())
  if low < 0 or high >= vocab_size:
    raise ValueError(f'{name} holds token id {low if low < 0 else high}, outside the '
                     f'vocabulary of {vocab_size} ids (0 to {vocab_size - 1}); check the '
                     'tokenizer against the model\'s vocab_size.')
