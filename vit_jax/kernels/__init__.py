"""Fast paths for the plain-Flax models: native CPU kernels and cheap dropout masks.

The native kernels are called from XLA through its FFI (built on first use).
`use(matmul, dropout)` puts the models' products, attention and dropout masks on them
(see `seam`).
"""

from vit_jax.kernels.seam import DROPOUT_MASKS, products_on_blas, use

__all__ = ['DROPOUT_MASKS', 'products_on_blas', 'use']
