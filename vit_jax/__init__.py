"""vit_jax: Vision Transformers and the seq2seq Transformer in JAX/Flax."""

__version__ = '0.1.0'
