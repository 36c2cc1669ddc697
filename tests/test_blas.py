"""The BLAS path of the Dense layers and attention (vit_jax.kernels): same results as XLA."""

import ctypes

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import on_numpys_openblas

from vit_jax import kernels, models
from vit_jax.kernels import blas
from vit_jax.flops import count_flops

try:
  BLAS = blas.load()
except blas.KernelUnavailable as error:  # No compiler or no BLAS on this machine.
  pytest.skip(f'BLAS kernels unavailable: {error}', allow_module_level=True)

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _the_same_inputs_whatever_ran_before():
  """Each test draws the same inputs, whichever tests its xdist worker ran before it."""
  RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


def _random(*shape):
  return jnp.asarray(RNG.standard_normal(shape, np.float32))


def _on_blas(fn):
  """`fn`, traced with the models' products and attention on the BLAS."""
  def run(*args):
    with kernels.use('blas'):
      return fn(*args)
  return run


def _ffi_calls(fn, *args) -> int:
  return str(jax.make_jaxpr(fn)(*args)).count(blas.GEMM_TARGET)


def test_matmul_and_its_gradients_match_xla():
  a, b = _random(37, 19), _random(19, 23)
  np.testing.assert_allclose(jax.jit(blas.matmul)(a, b), a @ b, rtol=1e-5, atol=1e-5)
  loss = lambda f: (lambda a, b: jnp.sum(jnp.sin(f(a, b))))  # noqa: E731
  ours = jax.jit(jax.grad(loss(blas.matmul), argnums=(0, 1)))(a, b)
  ref = jax.grad(loss(jnp.matmul), argnums=(0, 1))(a, b)
  for got, want in zip(ours, ref):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # The backward pass reads the transposes in place: two more BLAS calls, no XLA dot.
  jaxpr = str(jax.make_jaxpr(jax.grad(loss(blas.matmul), argnums=(0, 1)))(a, b))
  assert jaxpr.count(blas.GEMM_TARGET) == 3 and 'dot_general' not in jaxpr


def test_dot_general_handles_dense_general_products():
  # DenseGeneral of the attention output: (B, T, N, H) x (N, H, D) over (N, H).
  x, kernel = _random(2, 5, 3, 4), _random(3, 4, 6)
  dims = (((2, 3), (0, 1)), ((), ()))
  got = jax.jit(lambda x, k: blas.dot_general(x, k, dims))(x, kernel)
  np.testing.assert_allclose(got, jax.lax.dot_general(x, kernel, dims), rtol=1e-5, atol=1e-5)
  assert got.shape == (2, 5, 6)
  assert _ffi_calls(lambda x, k: blas.dot_general(x, k, dims), x, kernel) == 1


@pytest.mark.skipif(not BLAS.bf16_symbol, reason=f'{BLAS.name} has no bfloat16 gemm')
def test_bfloat16_matmul_and_its_gradients_match_xla():
  a, b = _random(37, 19).astype(jnp.bfloat16), _random(19, 23).astype(jnp.bfloat16)
  got = jax.jit(blas.matmul)(a, b)
  assert got.dtype == jnp.bfloat16
  # Both accumulate in float32 and round once: at most one bfloat16 step apart.
  want = jnp.matmul(a, b)
  np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2 ** -7,
                             atol=1e-2)
  # A fixed cotangent: the gradients are the backward products alone, again one rounding each.
  # (Through a nonlinearity of the bfloat16 output, one step's difference there moves the
  # gradient by more than a step: such a check failed for 11 of 200 random inputs.)
  cotangent = _random(37, 23)
  loss = lambda f: (lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * cotangent))  # noqa: E731
  ours = jax.jit(jax.grad(loss(blas.matmul), argnums=(0, 1)))(a, b)
  ref = jax.jit(jax.grad(loss(jnp.matmul), argnums=(0, 1)))(a, b)
  for got, want in zip(ours, ref):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2 ** -7,
                               atol=1e-2)
  jaxpr = str(jax.make_jaxpr(jax.grad(loss(blas.matmul), argnums=(0, 1)))(a, b))
  assert jaxpr.count(blas.GEMM_BF16_TARGET) == 3 and 'dot_general' not in jaxpr


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_a_tied_output_projection_and_its_gradients_run_on_the_blas(dtype):
  # nn.Embed.attend: activations (B, T, D) times the table (V, D) transposed, as the seq2seq
  # Transformer computes its logits; the BLAS reads the table transposed in place.
  if dtype == jnp.bfloat16 and not BLAS.bf16_symbol:
    pytest.skip(f'{BLAS.name} has no bfloat16 gemm')
  embed = nn.Embed(11, 6, dtype=dtype)
  query, table = _random(2, 3, 6).astype(dtype), _random(11, 6)
  cotangent = _random(2, 3, 11)

  def loss(query, table):
    logits = embed.apply({'params': {'embedding': table}}, query, method='attend')
    return jnp.sum(logits.astype(jnp.float32) * cotangent)

  ours = jax.jit(_on_blas(jax.value_and_grad(loss, argnums=(0, 1))))(query, table)
  want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(query, table)
  # bfloat16: both accumulate in float32 and round each product once.
  tolerance = 1e-5 if dtype == jnp.float32 else 2 ** -7
  for got, expected in zip(jax.tree.leaves(ours), jax.tree.leaves(want)):
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32),
                               rtol=tolerance, atol=tolerance * 10)
  target = blas.GEMM_TARGET if dtype == jnp.float32 else blas.GEMM_BF16_TARGET
  jaxpr = str(jax.make_jaxpr(_on_blas(jax.grad(loss, argnums=(0, 1))))(query, table))
  assert jaxpr.count(target) == 3 and 'dot_general' not in jaxpr
  assert target not in str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(query, table))


def test_the_transformers_tied_projection_runs_on_the_blas_like_an_untied_one():
  source = jnp.asarray(RNG.integers(1, 13, (2, 5)), jnp.int32)
  target = jnp.asarray(RNG.integers(1, 13, (2, 4)), jnp.int32)
  calls = {}
  for tied in (True, False):
    model = models.get_model('Transformer-testing', vocab_size=13, dropout_rate=0.0,
                             logits_via_embedding=tied)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), source, target)['params']
    loss = lambda p, m=model: jnp.sum(  # noqa: E731
        jax.nn.log_softmax(m.apply({'params': p}, source, target))[..., 2])
    np.testing.assert_allclose(jax.jit(_on_blas(loss))(params), jax.jit(loss)(params),
                               rtol=1e-5)
    got = jax.jit(_on_blas(jax.grad(loss)))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(jax.jit(jax.grad(loss))(params))):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    calls[tied] = _ffi_calls(_on_blas(jax.grad(loss)), params)
    assert count_flops(_on_blas(jax.grad(loss)), params) == count_flops(jax.grad(loss), params)
  # The output projection's three products (forward, both gradients) run on the BLAS either
  # way: as the Dense 'logits' layer, or through the shared embedding's `attend`.
  assert calls[True] == calls[False] > 3, calls


def _set_bf16_packing(on: bool):
  """Registers MKL's packed bfloat16 product with the kernels (on), or not (off)."""
  library, kernels_library = blas._LIBRARIES
  pointer = lambda symbol: ctypes.cast(getattr(library, symbol), ctypes.c_void_p)  # noqa: E731
  packing = map(pointer, BLAS.bf16_pack_symbols) if on else (None,) * 3
  kernels_library.vit_jax_set_blas(pointer(BLAS.sgemm_symbol), pointer(BLAS.threads_symbol),
                                   pointer(BLAS.bf16_symbol), *packing)


@pytest.mark.skipif(not BLAS.bf16_symbol, reason=f'{BLAS.name} has no bfloat16 gemm')
def test_bfloat16_products_pack_first_where_mkl_can_and_equal_the_unpacked_ones():
  assert BLAS.bf16_pack_symbols  # Every MKL with cblas_gemm_bf16bf16f32 has them.
  # Products of more than 128 rows pack (fewer multiply unpacked): the product (150 rows),
  # the gradient of b (a transposed: 140 rows); the gradient of a (150 rows) as well.
  a, b = _random(150, 140).astype(jnp.bfloat16), _random(140, 23).astype(jnp.bfloat16)
  cotangent = _random(150, 23)
  loss = lambda a, b: jnp.sum(blas.matmul(a, b).astype(jnp.float32) * cotangent)  # noqa: E731
  # The product and both gradients: op(b) plain and transposed, op(a) plain and transposed.
  run = jax.jit(lambda a, b: (blas.matmul(a, b), *jax.grad(loss, argnums=(0, 1))(a, b)))
  packed = run(a, b)
  try:
    _set_bf16_packing(False)
    unpacked = run(a, b)
  finally:
    _set_bf16_packing(True)
  for got, want in zip(packed, unpacked):
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.skipif(not BLAS.bf16_symbol, reason=f'{BLAS.name} has no bfloat16 gemm')
def test_a_bfloat16_vit_on_blas_matches_xla():
  model = models.get_model('ViT-testing', num_classes=5, dtype=jnp.bfloat16)
  images = _random(2, 16, 16, 3)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images)['params']
  params['head']['kernel'] = _random(*params['head']['kernel'].shape)
  apply = lambda p: model.apply({'params': p}, images)  # noqa: E731
  got, want = jax.jit(_on_blas(apply))(params), jax.jit(apply)(params)
  # bfloat16 rounding (8 bits) in another order through the layers: a few steps of the
  # largest logit's.
  got, want = got.astype(np.float32), want.astype(np.float32)
  np.testing.assert_allclose(got, want, atol=2 ** -6 * float(np.abs(want).max()))
  jaxpr = str(jax.make_jaxpr(_on_blas(apply))(params))
  # Every Dense product (q, k, v, out, 2 MLP per block; the head) on the BLAS (where MKL packs,
  # with its bias, and the patch embedding too: tests/test_blas_dense.py), and attention on
  # its bfloat16 kernel.
  patch_embedding = int('conv_general_dilated' not in jaxpr)
  assert (jaxpr.count(blas.GEMM_BF16_TARGET) + jaxpr.count(blas.DENSE_BF16_TARGET)
          == 6 * model.num_layers + 1 + patch_embedding)
  assert jaxpr.count(blas.ATTENTION_INFERENCE_BF16_TARGET) == model.num_layers


@pytest.mark.parametrize('case', ['batch dims', 'mixed bfloat16', 'leading contraction'])
def test_dot_general_leaves_other_products_to_xla(case):
  if case == 'batch dims':
    lhs, rhs, dims = _random(2, 3, 4), _random(2, 4, 5), (((2,), (1,)), ((0,), (0,)))
  elif case == 'mixed bfloat16':
    lhs, rhs, dims = _random(3, 4).astype(jnp.bfloat16), _random(4, 5), (((1,), (0,)), ((), ()))
  else:
    lhs, rhs, dims = _random(4, 3), _random(4, 5), (((0,), (0,)), ((), ()))
  fn = lambda a, b: blas.dot_general(a, b, dims)  # noqa: E731
  assert _ffi_calls(fn, lhs, rhs) == 0
  np.testing.assert_array_equal(fn(lhs, rhs), jax.lax.dot_general(lhs, rhs, dims))


def test_vit_with_blas_matches_xla_forward_and_gradients():
  # Scanned layers: the BLAS calls sit inside nn.scan's body (and its transpose).
  model = models.get_model('ViT-testing', num_classes=5, scan_layers=True,
                           representation_size=8)
  images = _random(2, 16, 16, 3)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images)['params']
  params['head']['kernel'] = _random(*params['head']['kernel'].shape)
  apply = lambda p: model.apply({'params': p}, images)  # noqa: E731
  loss = lambda p: jnp.sum(model.apply({'params': p}, images, train=True) ** 2)  # noqa: E731

  np.testing.assert_allclose(jax.jit(_on_blas(apply))(params), jax.jit(apply)(params),
                             rtol=1e-4, atol=1e-4)
  got = jax.jit(_on_blas(jax.grad(loss)))(params)
  want = jax.jit(jax.grad(loss))(params)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    # float32 sums in another order: about 1e-6 of each gradient's scale (measured).
    # The key bias has no gradient (the softmax ignores it): there, rounding noise.
    scale = float(np.abs(w).max())
    assert float(np.abs(g - w).max()) <= 1e-5 * scale + 1e-5, (jax.tree_util.keystr(path),
                                                              scale)
  # Every Dense product ran on the BLAS: q, k, v, out and 2 MLP layers in the scanned
  # block, then pre_logits and the head; and so did the attention.
  assert _ffi_calls(_on_blas(loss), params) == 6 + 2
  assert blas.ATTENTION_INFERENCE_TARGET in str(jax.make_jaxpr(_on_blas(loss))(params))
  assert blas.ATTENTION_FORWARD_TARGET in str(jax.make_jaxpr(_on_blas(jax.grad(loss)))(params))
  # Outside `kernels.use` the same model is plain XLA.
  assert _ffi_calls(loss, params) == 0


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_flops_of_blas_products_count_like_xla(dtype):
  if dtype == jnp.bfloat16 and not BLAS.bf16_symbol:
    pytest.skip(f'{BLAS.name} has no bfloat16 gemm')
  model = models.get_model('ViT-testing', num_classes=5, dtype=dtype)
  images = jnp.zeros((2, 16, 16, 3))
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)['params']  # Only traced.

  def grad_fn(m):
    return jax.grad(lambda p: jnp.sum(m.apply({'params': p}, images)))

  assert count_flops(_on_blas(grad_fn(model)), params) == count_flops(
      grad_fn(model), params) > 0
  # The attention kernels (forward without and with the weights kept, backward).
  forward = lambda m: (lambda p: m.apply({'params': p}, images))  # noqa: E731
  on_blas = model.clone(attention_impl='blas')
  for fn in (forward, grad_fn):
    assert count_flops(_on_blas(fn(on_blas)), params) == count_flops(
        fn(model.clone(attention_impl='plain')), params)


def test_resolve_matmul():
  assert blas.resolve_matmul('xla') == 'xla'
  assert blas.resolve_matmul('blas') == 'blas'
  with pytest.raises(ValueError, match="Unknown matmul implementation 'mkl'"):
    blas.resolve_matmul('mkl')
  with pytest.raises(ValueError, match='Unknown matmul'):
    with kernels.use('fast'):
      pass


@pytest.mark.parametrize('vendor, blas_name, matmul, expected', [
    ('AuthenticAMD', 'mkl', 'auto', ('xla', 'blas')),  # Attention alone on MKL.
    ('AuthenticAMD', 'mkl', 'xla', ('xla', 'head_major')),  # 'xla' keeps attention there too.
    ('AuthenticAMD', 'openblas', 'auto', ('xla', 'head_major')),
    ('GenuineIntel', 'mkl', 'auto', ('blas', 'blas')),  # Products and attention on MKL.
    ('GenuineIntel', 'openblas', 'auto', ('xla', 'head_major')),
    ('', 'mkl', 'auto', ('xla', 'head_major')),  # A CPU that does not say.
])
def test_auto_puts_products_and_attention_where_they_were_measured_faster(
    monkeypatch, vendor, blas_name, matmul, expected):
  monkeypatch.setattr(blas, '_cpu_vendor', lambda: vendor)
  monkeypatch.setattr(blas, '_cpu_has_amx', lambda: False)
  monkeypatch.setattr(blas, '_mkl_found', lambda: blas_name == 'mkl')

  def load():
    assert blas_name == 'mkl', 'the kernels were built for OpenBLAS, which auto never runs'
    return BLAS._replace(name=blas_name), None

  monkeypatch.setattr(blas, '_load', load)
  model = models.get_model('ViT-testing', num_classes=10)
  images = _random(2, 16, 16, 3)
  params = model.init(jax.random.key(0), images)['params']
  with kernels.use(matmul):
    resolved = (blas.resolve_matmul(matmul),
                models.resolve_attention_impl('auto', backend='cpu'))
    jaxpr = str(jax.make_jaxpr(lambda p: model.apply({'params': p}, images))(params))
  assert resolved == expected
  assert (blas.GEMM_TARGET in jaxpr) == (expected[0] == 'blas')
  assert (blas.ATTENTION_INFERENCE_TARGET in jaxpr) == (expected[1] == 'blas')
  with kernels.use('auto'):  # Bfloat16 stays on XLA on CPUs without AMX (next test).
    assert not blas.attention_on_blas('auto', dtype=jnp.bfloat16)


@pytest.mark.parametrize('vendor, amx, bf16_gemm, expected', [
    ('GenuineIntel', True, True, ('blas', 'blas')),  # AMX: bfloat16 on MKL, attention too.
    ('GenuineIntel', False, True, ('xla', 'head_major')),  # Measured only with AMX.
    ('GenuineIntel', True, False, ('xla', 'head_major')),  # An MKL without the bf16 gemm.
    ('AuthenticAMD', False, True, ('xla', 'head_major')),  # No AMX there.
])
def test_auto_runs_bfloat16_on_mkl_where_the_cpu_has_amx(monkeypatch, vendor, amx, bf16_gemm,
                                                          expected):
  monkeypatch.setattr(blas, '_cpu_vendor', lambda: vendor)
  monkeypatch.setattr(blas, '_cpu_has_amx', lambda: amx)
  monkeypatch.setattr(blas, '_mkl_found', lambda: True)
  loaded = BLAS._replace(name='mkl', bf16_symbol='cblas_gemm_bf16bf16f32_64' if bf16_gemm else None)
  monkeypatch.setattr(blas, '_load', lambda: (loaded, None))
  model = models.get_model('ViT-testing', num_classes=10, dtype=jnp.bfloat16)
  images = _random(2, 16, 16, 3)
  params = model.init(jax.random.key(0), images)['params']
  with kernels.use('auto'):
    resolved = (blas.resolve_matmul('auto', dtype=jnp.bfloat16),
                models.resolve_attention_impl('auto', backend='cpu', dtype=jnp.bfloat16))
    jaxpr = str(jax.make_jaxpr(lambda p: model.apply({'params': p}, images))(params))
  assert resolved == expected
  # The products with their bias where MKL packs (tests/test_blas_dense.py).
  on_blas = blas.GEMM_BF16_TARGET in jaxpr or blas.DENSE_BF16_TARGET in jaxpr
  assert on_blas == (expected[0] == 'blas')
  assert (blas.ATTENTION_INFERENCE_BF16_TARGET in jaxpr) == (expected[1] == 'blas')
  assert blas.resolve_matmul('auto') == ('blas' if vendor == 'GenuineIntel' else 'xla')


def test_numpys_openblas_runs_the_kernels_too():
  """Without MKL the kernels run on the OpenBLAS inside NumPy's wheels, threads and all."""
  out = on_numpys_openblas(
      'import jax, jax.numpy as jnp, numpy as np\n'
      'from vit_jax.kernels import blas, blas_attention\n'
      'from vit_jax.models import plain_attention\n'
      'r = np.random.default_rng(0)\n'
      'q, k, v = (jnp.asarray(r.standard_normal((4, 9, 3, 8), np.float32)) for _ in range(3))\n'
      'np.testing.assert_allclose(jax.jit(blas_attention.attention)(q, k, v),\n'
      '                           plain_attention(q, k, v)[0], rtol=1e-5, atol=1e-5)\n'
      'a, b = r.standard_normal((64, 48), np.float32), r.standard_normal((48, 32), np.float32)\n'
      'np.testing.assert_allclose(jax.jit(blas.matmul)(a, b), a @ b, rtol=1e-4, atol=1e-4)\n'
      'assert blas.load().name == "openblas", blas.load()\n'  # Loaded on first use.
      'print("openblas ok")\n')
  assert out.returncode == 0 and 'openblas ok' in out.stdout, out.stderr[-3000:]
