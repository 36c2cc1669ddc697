"""`models.cast.cast_as_used`: params stored in the dtype the model casts them to."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import cast


def _dtypes(params) -> dict:
  return {jax.tree_util.keystr(path): leaf.dtype
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def _init(model, images):
  return jax.jit(model.init)(jax.random.PRNGKey(0), images)['params']


@pytest.mark.parametrize('fields', [{}, {'scan_layers': True}], ids=['layers', 'scan_layers'])
def test_a_bfloat16_vit_computes_the_same_logits_from_half_the_bytes(fields):
  model = models.get_model('ViT-testing', num_classes=5, dtype=jnp.bfloat16, **fields)
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
  params = _init(model, images)
  apply = lambda p, x: model.apply({'params': p}, x)  # noqa: E731
  stored = cast.cast_as_used(apply, params, images)
  dtypes = _dtypes(stored)
  for path, dtype in dtypes.items():
    # LayerNorms use their scale and bias in float32; every other weight is cast.
    want = jnp.float32 if 'LayerNorm' in path or 'encoder_norm' in path else jnp.bfloat16
    assert dtype == want, path
  assert any('scale' in path for path in dtypes)
  np.testing.assert_array_equal(np.asarray(jax.jit(apply)(stored, images), np.float32),
                                np.asarray(jax.jit(apply)(params, images), np.float32))
  bytes_of = lambda tree: sum(leaf.nbytes for leaf in jax.tree.leaves(tree))  # noqa: E731
  assert bytes_of(stored) < 0.55 * bytes_of(params)


def test_a_float32_model_keeps_its_params():
  model = models.get_model('ViT-testing', num_classes=5)
  images = jnp.zeros((1, 16, 16, 3))
  params = _init(model, images)
  stored = cast.cast_as_used(lambda p, x: model.apply({'params': p}, x), params, images)
  assert set(_dtypes(stored).values()) == {jnp.dtype(jnp.float32)}


def test_the_hybrids_standardized_convolutions_keep_float32_kernels():
  model = models.get_model('R+ViT-testing', num_classes=5, dtype=jnp.bfloat16)
  images = jnp.zeros((1, 32, 32, 3))
  params = _init(model, images)
  dtypes = _dtypes(cast.cast_as_used(lambda p, x: model.apply({'params': p}, x), params,
                                     jax.ShapeDtypeStruct(images.shape, images.dtype)))
  # StdConv standardizes its kernel in float32 before the convolution.
  resnet = {path: dtype for path, dtype in dtypes.items() if "['conv_root']" in path}
  assert resnet and set(resnet.values()) == {jnp.dtype(jnp.float32)}
  assert dtypes["['embedding']['kernel']"] == jnp.bfloat16


def test_only_params_cast_at_every_use_to_one_narrower_dtype_are_cast():
  params = {name: jnp.ones((2, 3), jnp.float32) for name in
            ('cast', 'cast_twice', 'also_used_as_is', 'returned', 'two_dtypes', 'reshaped',
             'in_a_jit', 'in_a_scan')}
  params['wider'] = jnp.ones((2, 3), jnp.bfloat16)

  def fn(p, x):
    bf16 = lambda a: a.astype(jnp.bfloat16)  # noqa: E731
    total = bf16(p['cast']) * x + bf16(p['cast_twice']) + bf16(p['cast_twice']) * 2
    total += bf16(p['also_used_as_is']) + (p['also_used_as_is'] * 2).astype(jnp.bfloat16)
    total += bf16(p['two_dtypes']) + p['two_dtypes'].astype(jnp.float16).astype(jnp.bfloat16)
    total += bf16(p['reshaped'].reshape(3, 2)).T
    total += jax.jit(bf16)(p['in_a_jit'])
    total += jax.lax.scan(lambda c, row: (c, bf16(row)), 0, p['in_a_scan'])[1]
    total += p['wider'].astype(jnp.float32).astype(jnp.bfloat16)
    return total, p['returned']

  dtypes = _dtypes(cast.cast_as_used(fn, params, jnp.ones((2, 3), jnp.bfloat16)))
  names = {path.strip("[']"): dtype for path, dtype in dtypes.items()}
  assert names == {
      'cast': jnp.bfloat16, 'cast_twice': jnp.bfloat16, 'reshaped': jnp.bfloat16,
      'in_a_jit': jnp.bfloat16, 'in_a_scan': jnp.bfloat16,
      'also_used_as_is': jnp.float32, 'returned': jnp.float32, 'two_dtypes': jnp.float32,
      'wider': jnp.bfloat16}
