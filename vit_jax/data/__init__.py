"""Input pipelines. `vit_jax.data.images`: image classification (digits, TFDS, image folders)."""
