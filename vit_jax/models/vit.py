"""Vision Transformer (Dosovitskiy et al. 2020), hybrid ResNet+ViT and DeiT.

Data flow: image (B, H, W, C) -> [ResNet stem] -> strided-conv patch embedding
`embedding` -> tokens (B, N, D) -> [cls] (+ [dist]) tokens -> `Transformer`
(learned `posembed_input`, encoder blocks, `encoder_norm`) -> pooled
representation -> [`pre_logits` tanh] -> `head` (+ `head_dist`).
"""

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models.layers import Encoder
from vit_jax.models.position import sincos_2d
from vit_jax.models.resnet import resnet_stem

Array = jax.Array
Dtype = Any

CLASSIFIERS = ('token', 'gap', 'token_distill')
# The learned tokens in front of the patches, per classifier (their parameter names, in order).
PREFIX_TOKENS = {'token': ('cls',), 'token_distill': ('cls', 'dist'), 'gap': ()}
IMAGE_POSITION_EMBEDDINGS = ('learned', 'sincos2d', 'none')


class VisionTransformer(nn.Module):
  """ViT classifier; `num_classes=0` returns the pooled features.

  Called as `model.apply(variables, images, train=False)` on NHWC float images.
  With `classifier='token_distill'` (DeiT) training returns the pair
  (class-token logits, distillation-token logits) and inference their mean.
  """
  num_classes: int
  patch_size: tuple[int, int] = (16, 16)
  hidden_size: int = 768
  num_layers: int = 12
  mlp_dim: int = 3072
  num_heads: int = 12
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  droppath_rate: float = 0.0  # Stochastic depth at the top block (linear from 0).
  classifier: str = 'token'  # 'token', 'gap' or 'token_distill' (DeiT).
  representation_size: int | None = None  # Width of a tanh `pre_logits` layer.
  position_embedding: str = 'learned'  # 'learned', 'sincos2d' (fixed) or 'none'.
  resnet_layers: Sequence[int] | None = None  # Hybrid: units per ResNet stage.
  resnet_width_factor: float = 1.0
  attention_impl: str = 'auto'  # 'auto' (per backend), 'fused', 'plain', 'chunked', ...
  scan_layers: bool = False  # nn.scan over blocks (fast compile for deep models).
  remat: bool = False  # Gradient checkpointing per block.
  head_bias_init: float = 0.0
  dtype: Dtype = jnp.float32  # Compute dtype; logits are returned in float32.
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array | tuple[Array, Array]:
    self._check_options()
    if images.ndim != 4:
      raise ValueError(f'Expected NHWC images (batch, height, width, channels), '
                       f'got shape {images.shape}.')
    if images.shape[1] in (1, 3) and images.shape[3] > 4:
      raise ValueError(f'Expected NHWC images (batch, height, width, channels), got shape '
                       f'{images.shape}, which looks channels-first (NCHW, as torch lays them '
                       'out): images.transpose(0, 2, 3, 1) gives NHWC.')
    self._check_divisible(images.shape)
    x = images.astype(self.dtype)

    if self.resnet_layers is not None:
      x = resnet_stem(x, num_layers=tuple(self.resnet_layers),
                      width_factor=self.resnet_width_factor,
                      dtype=self.dtype, param_dtype=self.param_dtype)

    x = nn.Conv(self.hidden_size, tuple(self.patch_size), strides=tuple(self.patch_size),
                padding='VALID', dtype=self.dtype, param_dtype=self.param_dtype,
                name='embedding')(x)  # (B, h, w, D)
    batch, grid_h, grid_w, width = x.shape
    x = jnp.reshape(x, (batch, grid_h * grid_w, width))  # (B, N, D)
    if self.position_embedding == 'sincos2d':
      x = x + jnp.asarray(sincos_2d(grid_h, grid_w, width), self.dtype)[None]

    tokens = [jnp.broadcast_to(
        self.param(name, nn.initializers.zeros, (1, 1, width), self.param_dtype
                   ).astype(self.dtype), (batch, 1, width))
              for name in PREFIX_TOKENS[self.classifier]]
    x = jnp.concatenate(tokens + [x], axis=1)  # (B, extra + N, D)

    x = Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        droppath_rate=self.droppath_rate,
        position_embedding='learned' if self.position_embedding == 'learned' else 'none',
        norm_position='pre', activation='gelu', attention_impl=self.attention_impl,
        scan_layers=self.scan_layers, remat=self.remat, dtype=self.dtype,
        param_dtype=self.param_dtype, name='Transformer')(x, train=train)

    pre_logits = lambda features: features  # noqa: E731
    if self.representation_size is not None:
      dense = nn.Dense(self.representation_size, dtype=self.dtype,
                       param_dtype=self.param_dtype, name='pre_logits')
      pre_logits = lambda features: jnp.tanh(dense(features))  # noqa: E731

    features = pre_logits(jnp.mean(x, axis=1) if self.classifier == 'gap' else x[:, 0])
    if self.num_classes == 0:
      return features.astype(jnp.float32)
    logits = self._head('head', features)
    if self.classifier != 'token_distill':
      return logits
    logits_dist = self._head('head_dist', pre_logits(x[:, 1]))
    return (logits, logits_dist) if train else (logits + logits_dist) / 2

  def _head(self, name: str, features: Array) -> Array:
    logits = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype,
                      kernel_init=nn.initializers.zeros,
                      bias_init=nn.initializers.constant(self.head_bias_init),
                      name=name)(features)
    return logits.astype(jnp.float32)

  def _check_options(self):
    if self.classifier not in CLASSIFIERS:
      raise errors.ConfigError(f'Unknown classifier {self.classifier!r}; choose one of '
                               f'{CLASSIFIERS}.')
    if self.position_embedding not in IMAGE_POSITION_EMBEDDINGS:
      raise errors.ConfigError(f'Unknown position_embedding {self.position_embedding!r}; '
                               f'choose one of {IMAGE_POSITION_EMBEDDINGS}.')
    if self.hidden_size % self.num_heads:
      raise errors.ConfigError(f'hidden_size={self.hidden_size} is not divisible by '
                               f'num_heads={self.num_heads}.')

  def _check_divisible(self, image_shape):
    """Images must tile exactly into patches (of the hybrid's feature map)."""
    patch_h, patch_w = self.patch_size
    stride = stem_stride(self.resnet_layers)
    height, width = image_shape[1:3]
    if height % (stride * patch_h) or width % (stride * patch_w):
      if stride == 1:
        needed = f'the patch size {patch_h}x{patch_w}'
      else:
        needed = (f'{stride * patch_h}' + (f'x{stride * patch_w}' if patch_h != patch_w else '')
                  + f" (the ResNet stem's stride {stride} x patch size {patch_h}x{patch_w})")
      raise errors.ConfigError(f'Image size {height}x{width} is not a multiple of {needed}; '
                               'resize or crop the images.')


def stem_stride(resnet_layers: Sequence[int] | None) -> int:
  """Pixels per feature-map cell before patching: 1, or the hybrid ResNet stem's stride.

  The stem's root conv and max-pool stride 4; each stage after the first strides 2.
  """
  if resnet_layers is None:
    return 1
  return 4 * 2 ** max(len(resnet_layers) - 1, 0)
