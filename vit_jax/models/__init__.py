"""Flax modules: attention, encoder blocks, ViT (plain, hybrid, DeiT), Transformer."""

from vit_jax.models.attention import (MultiHeadDotProductAttention, chunked_attention,
                                      fused_attention, head_major_attention, plain_attention,
                                      resolve_attention_impl)
from vit_jax.models.masks import make_causal_mask, make_padding_mask, make_segment_mask
from vit_jax.models.layers import (Encoder, EncoderBlock, MlpBlock, stack_layers,
                                   unstack_layers)
from vit_jax.models.position import (AddPositionEmbs, AddSinusoidalPositions,
                                     sincos_2d, sinusoidal_1d)
from vit_jax.models.registry import MODELS, get_model, model_config, model_names
from vit_jax.models.transformer import Decoder, DecoderBlock, Transformer
from vit_jax.models.vit import VisionTransformer

__all__ = [
    'AddPositionEmbs', 'AddSinusoidalPositions', 'Decoder', 'DecoderBlock', 'Encoder',
    'EncoderBlock', 'MODELS', 'MlpBlock', 'MultiHeadDotProductAttention',
    'Transformer', 'VisionTransformer', 'chunked_attention', 'fused_attention', 'get_model',
    'head_major_attention', 'resolve_attention_impl',
    'make_causal_mask', 'make_padding_mask', 'make_segment_mask', 'model_config', 'model_names',
    'plain_attention', 'sincos_2d', 'sinusoidal_1d', 'stack_layers', 'unstack_layers',
]
