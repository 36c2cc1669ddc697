"""Encoder building blocks shared by ViT and the seq2seq Transformer.

`EncoderBlock` is one attention + MLP layer, pre-LayerNorm (ViT) or
post-LayerNorm (original Transformer). `Encoder` stacks them, optionally with
`nn.scan` (one compiled block) and `nn.remat` (recompute activations in the
backward pass). Names follow the published ViT checkpoints:
`encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
MlpBlock_3}`, or a single `encoderblock` with a leading layer axis when scanned.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import attention, partitioning
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.position import AddPositionEmbs, AddSinusoidalPositions

Array = jax.Array
Dtype = Any

ACTIVATIONS = {'gelu': nn.gelu, 'relu': nn.relu}
NORM_POSITIONS = ('pre', 'post')
POSITION_EMBEDDINGS = ('learned', 'sinusoidal', 'none')


def activation_fn(name: str):
  """The activation `name`; on CPUs, bfloat16 and float16 inputs are activated in float32 and
  rounded once.

  XLA:CPU rounds the result of each of the activation's operations to the input's dtype (the
  GELU has nine): less accurate than one rounding, and there several times slower. XLA on GPUs
  keeps the intermediates in float32 itself and may compute the activation in the product's
  epilogue (cuBLASLt BIAS_GELU), which explicit conversions would prevent. The choice is made
  where the model is lowered for a platform (`jax.lax.platform_dependent`), so that a model
  exported on a CPU for several platforms gets each platform's.
  """
  if name not in ACTIVATIONS:
    raise errors.ConfigError(f'Unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}.')
  activation = ACTIVATIONS[name]

  def rounded_once(x: Array) -> Array:
    return activation(x.astype(jnp.float32)).astype(x.dtype)

  def activate(x: Array) -> Array:
    if jnp.promote_types(x.dtype, jnp.float32) == x.dtype:  # float32 or wider: as it is.
      return activation(x)
    return jax.lax.platform_dependent(x, cpu=rounded_once, default=activation)
  return activate


def drop_path(x: Array, rate: Array | float, rng: Array) -> Array:
  """Stochastic depth: zeroes whole examples of a residual branch with prob `rate`."""
  keep_prob = 1.0 - rate
  keep = jax.random.bernoulli(rng, keep_prob, (x.shape[0],) + (1,) * (x.ndim - 1))
  return jnp.where(keep, x / keep_prob, 0.0).astype(x.dtype)


class MlpBlock(nn.Module):
  """Dense -> activation -> dropout -> Dense -> dropout (`Dense_0`, `Dense_1`)."""
  mlp_dim: int
  dropout_rate: float = 0.0
  activation: str = 'gelu'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, *, deterministic: bool = True) -> Array:
    def dense(features, axes):  # Logical axes (in, out) say how tensor parallelism splits it.
      return nn.Dense(
          features, dtype=self.dtype, param_dtype=self.param_dtype,
          kernel_init=partitioning.logical(nn.initializers.xavier_uniform(), axes),
          bias_init=partitioning.logical(nn.initializers.normal(stddev=1e-6), axes[1:]))
    x = dense(self.mlp_dim, ('embed', 'mlp'))(inputs)
    # The gradient recomputes the activation from the product instead of keeping its
    # intermediates: on GPUs XLA then computes it in the product's epilogue (cuBLASLt
    # BIAS_GELU_AUX), and the step writes and reads one (tokens, mlp_dim) array less.
    x = jax.checkpoint(activation_fn(self.activation))(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = dense(inputs.shape[-1], ('mlp', 'embed'))(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """Self-attention + MLP, each a residual branch.

  pre:  x = x + Attn(LN(x));  x = x + MLP(LN(x))        (ViT)
  post: x = LN(x + Attn(x));  x = LN(x + MLP(x))        (Transformer paper)
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  stochastic_depth: bool = False  # Apply drop-path with the per-call rate.
  norm_position: str = 'pre'  # 'pre' (ViT) or 'post' (original Transformer).
  activation: str = 'gelu'
  attention_impl: str = 'auto'  # 'auto' or a kernel of attention.KERNELS.
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, droppath_rate: Array | float = 0.0,
               mask: Array | attention.KeyPadding | None = None,
               deterministic: bool = True) -> Array:
    if self.norm_position not in NORM_POSITIONS:
      raise errors.ConfigError(f'Unknown norm_position {self.norm_position!r}; '
                               f'choose one of {NORM_POSITIONS}.')
    pre_norm = self.norm_position == 'pre'
    layer_norm = lambda name: nn.LayerNorm(  # noqa: E731
        epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype, name=name)

    def residual(x, branch):
      if self.stochastic_depth and not deterministic:
        branch = drop_path(branch, droppath_rate, self.make_rng('dropout'))
      return x + branch

    x = layer_norm('LayerNorm_0')(inputs) if pre_norm else inputs
    x = MultiHeadDotProductAttention(
        num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
        implementation=self.attention_impl, dtype=self.dtype,
        param_dtype=self.param_dtype, name='MultiHeadDotProductAttention_1')(
            x, mask=mask, deterministic=deterministic)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = residual(inputs, x)
    if not pre_norm:
      x = layer_norm('LayerNorm_0')(x)

    y = layer_norm('LayerNorm_2')(x) if pre_norm else x
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
                 activation=self.activation, dtype=self.dtype,
                 param_dtype=self.param_dtype, name='MlpBlock_3')(
                     y, deterministic=deterministic)
    y = residual(x, y)
    if not pre_norm:
      y = layer_norm('LayerNorm_2')(y)
    return y


class Encoder(nn.Module):
  """Position encoding, dropout, `num_layers` EncoderBlocks, final LayerNorm.

  The final `encoder_norm` exists only for pre-LayerNorm stacks (post-LN
  blocks already end in a LayerNorm).
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  droppath_rate: float = 0.0  # Stochastic depth, rising linearly to this at the top.
  position_embedding: str = 'learned'  # 'learned', 'sinusoidal' or 'none'.
  norm_position: str = 'pre'
  activation: str = 'gelu'
  attention_impl: str = 'auto'
  scan_layers: bool = False  # nn.scan over blocks: params get a leading layer axis.
  remat: bool = False  # Recompute each block's activations in the backward pass.
  max_length: int = 2048  # Longest sequence for sinusoidal positions.
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, *, mask: Array | None = None, positions: Array | None = None,
               train: bool = False) -> Array:
    """x: (B, tokens, width) -> (B, tokens, width).

    `positions` (B, tokens): explicit token positions for sinusoidal encodings
    (packed sequences); default 0..tokens-1.
    """
    if self.position_embedding not in POSITION_EMBEDDINGS:
      raise errors.ConfigError(f'Unknown position_embedding {self.position_embedding!r}; '
                               f'choose one of {POSITION_EMBEDDINGS}.')
    if self.position_embedding == 'learned':
      x = AddPositionEmbs(param_dtype=self.param_dtype, name='posembed_input')(x)
    elif self.position_embedding == 'sinusoidal':
      x = AddSinusoidalPositions(max_length=self.max_length)(x, positions)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    tokens = x.shape[1]
    if mask is None:
      # A kernel that wants other lengths (cuDNN: even) gets the tokens padded once here,
      # hidden from attention as key padding, rather than q/k/v padded in every layer.
      padded = attention.padded_length(self.attention_impl, tokens, dtype=self.dtype)
      if padded > tokens:
        x = jnp.pad(x, ((0, 0), (0, padded - tokens), (0, 0)))  # (B, padded, width)
        mask = attention.KeyPadding(tokens)

    block_cls = EncoderBlock
    if self.remat:
      # Argument 4 (counting self) is `deterministic`, a Python bool.
      block_cls = nn.remat(EncoderBlock, prevent_cse=not self.scan_layers,
                           static_argnums=(4,))
    block_kwargs = dict(
        mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        stochastic_depth=self.droppath_rate > 0, norm_position=self.norm_position,
        activation=self.activation, attention_impl=self.attention_impl,
        dtype=self.dtype, param_dtype=self.param_dtype)
    droppath_rates = jnp.linspace(0.0, self.droppath_rate, self.num_layers)

    if self.scan_layers:
      def body(block, carry, rate):
        return block(carry, rate, mask, not train), None
      scanned = nn.scan(body, variable_axes={'params': 0, 'intermediates': 0},
                        split_rngs={'params': True, 'dropout': True},
                        length=self.num_layers,
                        metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = scanned(block_cls(**block_kwargs, name='encoderblock'), x, droppath_rates)
    else:
      for i in range(self.num_layers):
        x = block_cls(**block_kwargs, name=f'encoderblock_{i}')(
            x, droppath_rates[i], mask, not train)

    if self.norm_position == 'pre':
      x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype,
                       name='encoder_norm')(x)
    return x[:, :tokens]


def stack_layers(params: dict, prefix: str = 'encoderblock') -> dict:
  """Turns `{prefix}_0..{prefix}_{L-1}` subtrees into one `{prefix}` with a layer axis.

  Converts the parameters of a plain stack for a `scan_layers=True` model.
  Works on any nesting level: the first dict holding `{prefix}_0` is rewritten.
  """
  if f'{prefix}_0' in params:
    layers, rest, i = [], dict(params), 0
    while f'{prefix}_{i}' in rest:
      layers.append(rest.pop(f'{prefix}_{i}'))
      i += 1
    rest[prefix] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return rest
  return {k: stack_layers(v, prefix) if isinstance(v, dict) else v
          for k, v in params.items()}


def unstack_layers(params: dict, prefix: str = 'encoderblock') -> dict:
  """Inverse of `stack_layers`: one subtree per layer, `{prefix}_{i}`."""
  if prefix in params and isinstance(params[prefix], dict):
    rest = dict(params)
    stacked = rest.pop(prefix)
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    for i in range(num_layers):
      rest[f'{prefix}_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
    return rest
  return {k: unstack_layers(v, prefix) if isinstance(v, dict) else v
          for k, v in params.items()}
