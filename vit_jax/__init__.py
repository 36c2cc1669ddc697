"""vit_jax: Vision Transformers and the seq2seq Transformer in JAX/Flax."""

import os

# TensorFlow (the input pipelines) prints INFO lines on import; a user's setting wins.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

__version__ = '0.1.0'
