"""Native CPU kernels called from XLA through its FFI (built on first use).

`use(matmul)` puts the models' products and attention on them (see `seam`).
"""

from vit_jax.kernels.seam import products_on_blas, use

__all__ = ['products_on_blas', 'use']
