"""ViT, hybrid and DeiT: published sizes, equivalent variants, dtypes, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import layers
from vit_jax.models.resnet import StdConv

# Parameter counts of the published models (224x224 input, 1000 classes, no pre-logits).
PUBLISHED_PARAMETER_COUNTS = {
    ('ViT-Ti_16', 224): 5_717_416,
    ('ViT-S_16', 224): 22_050_664,
    ('ViT-S_32', 224): 22_878_952,
    ('ViT-B_16', 224): 86_567_656,
    ('ViT-B_16', 384): 86_859_496,
    ('ViT-B_32', 224): 88_224_232,
    ('ViT-L_16', 224): 304_326_632,
    ('ViT-L_32', 224): 306_535_400,
    ('ViT-H_14', 224): 632_045_800,
    ('R50+ViT-B_16', 224): 98_659_112,
    ('R26+ViT-S_32', 224): 36_431_912,
    ('R+ViT-Ti_16', 224): 6_337_704,
    ('DeiT-Ti_16', 224): 5_910_800,
    ('DeiT-S_16', 224): 22_436_432,
    ('DeiT-B_16', 224): 87_338_192,
}
IMAGE_TESTING_MODELS = ['ViT-testing', 'R+ViT-testing', 'DeiT-testing']
# One ResNet stage keeps the hybrid's compile times short in tests (registry: two).
FAST = {'R+ViT-testing': dict(resnet_layers=(1,))}


def _param_shapes(model, resolution):
  images = jax.ShapeDtypeStruct((1, resolution, resolution, 3), jnp.float32)
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x), images)['params']


@pytest.mark.parametrize('name,resolution', list(PUBLISHED_PARAMETER_COUNTS))
def test_parameter_count_matches_published(name, resolution):
  shapes = _param_shapes(models.get_model(name, num_classes=1000), resolution)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert count == PUBLISHED_PARAMETER_COUNTS[name, resolution]


def test_parameter_names_follow_published_checkpoints():
  shapes = _param_shapes(models.get_model('ViT-B_16', num_classes=1000), 224)
  flat = {'/'.join(k.key for k in path): leaf.shape
          for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  block = 'Transformer/encoderblock_11'
  expected = {
      'cls': (1, 1, 768), 'embedding/kernel': (16, 16, 3, 768), 'embedding/bias': (768,),
      'Transformer/posembed_input/pos_embedding': (1, 197, 768),
      f'{block}/LayerNorm_0/scale': (768,),
      f'{block}/MultiHeadDotProductAttention_1/query/kernel': (768, 12, 64),
      f'{block}/MultiHeadDotProductAttention_1/value/bias': (12, 64),
      f'{block}/MultiHeadDotProductAttention_1/out/kernel': (12, 64, 768),
      f'{block}/LayerNorm_2/bias': (768,),
      f'{block}/MlpBlock_3/Dense_0/kernel': (768, 3072),
      f'{block}/MlpBlock_3/Dense_1/kernel': (3072, 768),
      'Transformer/encoder_norm/scale': (768,), 'head/kernel': (768, 1000),
  }
  for name, shape in expected.items():
    assert flat[name] == shape, name
  hybrid = _param_shapes(models.get_model('R50+ViT-B_16', num_classes=1000), 224)
  assert hybrid['conv_root']['kernel'].shape == (7, 7, 3, 64)
  assert hybrid['embedding']['kernel'].shape == (1, 1, 1024, 768)
  assert set(hybrid['block3']) == {f'unit{u}' for u in range(1, 10)}
  assert set(hybrid['block1']['unit1']) == {'conv1', 'conv2', 'conv3', 'conv_proj', 'gn1',
                                            'gn2', 'gn3', 'gn_proj'}


def _perturbed_variables(model, images, seed=0):
  """Initialised variables with every leaf nudged (the heads start at zero)."""
  variables = model.init(jax.random.key(seed), images)
  rng = np.random.default_rng(seed)  # On the host: no program to compile for each shape.
  return jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape, np.float32), variables)


@pytest.fixture(scope='module')
def images():
  return jax.random.normal(jax.random.key(42), (2, 16, 16, 3))


@pytest.mark.parametrize('name', IMAGE_TESTING_MODELS)
def test_forward_shapes_and_features(name, images):
  model = models.get_model(name, num_classes=7, **FAST.get(name, {}))
  variables = model.init(jax.random.key(0), images)
  logits = model.apply(variables, images)
  assert logits.shape == (2, 7) and logits.dtype == jnp.float32
  np.testing.assert_array_equal(logits, 0.0)  # Zero-initialised head.
  features = models.get_model(name, num_classes=0, **FAST.get(name, {}))
  out = features.apply(features.init(jax.random.key(0), images), images)
  assert out.shape == (2, 32)
  assert 'head' not in features.init(jax.random.key(0), images)['params']


def test_representation_layer_and_gap_classifier(images):
  model = models.get_model('ViT-testing', num_classes=5, representation_size=24,
                           classifier='gap')
  variables = model.init(jax.random.key(0), images)
  assert variables['params']['pre_logits']['kernel'].shape == (32, 24)
  assert 'cls' not in variables['params']
  features = model.clone(num_classes=0).apply(variables, images)
  assert features.shape == (2, 24) and float(jnp.abs(features).max()) <= 1.0  # tanh


def test_deit_returns_both_logits_in_training_and_their_mean_at_inference(images):
  model = models.get_model('DeiT-testing', num_classes=5, droppath_rate=0.0)
  variables = _perturbed_variables(model, images)
  assert variables['params']['dist'].shape == (1, 1, 32)
  assert variables['params']['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 2 + 16, 32)
  logits, logits_dist = model.apply(variables, images, train=True)
  assert logits.shape == logits_dist.shape == (2, 5)
  assert not np.allclose(logits, logits_dist)
  np.testing.assert_allclose(model.apply(variables, images), (logits + logits_dist) / 2,
                             atol=1e-6)


@pytest.mark.parametrize('name', IMAGE_TESTING_MODELS)
@pytest.mark.parametrize('variant', [dict(scan_layers=True), dict(remat=True),
                                     dict(scan_layers=True, remat=True)],
                         ids=['scan', 'remat', 'scan+remat'])
def test_scan_and_remat_match_the_plain_stack(name, variant, images):
  plain = models.get_model(name, num_classes=5, **FAST.get(name, {}))
  variables = _perturbed_variables(plain, images)
  other = plain.clone(**variant)
  other_params = variables['params']
  if variant.get('scan_layers'):
    other_params = models.stack_layers(other_params)
    assert other_params['Transformer']['encoderblock']['LayerNorm_0']['scale'].shape == (2, 32)
    assert jax.tree.structure(other_params) == jax.tree.structure(
        jax.eval_shape(other.init, jax.random.key(0), images)['params'])
    round_trip = models.unstack_layers(other_params)
    assert jax.tree.all(jax.tree.map(np.array_equal, round_trip, variables['params']))
  # Compiled whole: op by op, the scanned stacks take about twice as long to check.
  np.testing.assert_allclose(jax.jit(other.apply)({'params': other_params}, images),
                             jax.jit(plain.apply)(variables, images), atol=1e-5)

  def loss(model, params):
    out = model.apply({'params': params}, images, train=True,
                      rngs={'dropout': jax.random.key(3)})
    return sum(jnp.sum(o**2) for o in (out if isinstance(out, tuple) else (out,)))

  grads = jax.jit(jax.grad(lambda p: loss(plain, p)))(variables['params'])
  other_grads = jax.jit(jax.grad(lambda p: loss(other, p)))(other_params)
  if variant.get('scan_layers'):
    other_grads = models.unstack_layers(other_grads)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_weight_standardised_conv():
  conv = StdConv(4, (3, 3), use_bias=False)
  x = jax.random.normal(jax.random.key(0), (1, 5, 5, 2))
  variables = conv.init(jax.random.key(1), x)
  kernel = np.asarray(variables['params']['kernel'], np.float64)
  standardised = (kernel - kernel.mean((0, 1, 2))) / np.sqrt(kernel.var((0, 1, 2)) + 1e-5)
  expected = jax.lax.conv_general_dilated(
      x, jnp.asarray(standardised, jnp.float32), (1, 1), 'SAME',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  np.testing.assert_allclose(conv.apply(variables, x), expected, atol=1e-5)


def test_hybrid_feature_map_is_patch_embedded():
  model = models.get_model('R+ViT-testing', num_classes=3)
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  # Root stride 4, second stage stride 2: 32x32 -> 4x4 tokens + class token.
  pos = variables['params']['Transformer']['posembed_input']['pos_embedding']
  assert pos.shape == (1, 1 + 16, 32)
  assert variables['params']['embedding']['kernel'].shape == (1, 1, 256, 32)


def test_droppath_only_in_training():
  images = jax.random.normal(jax.random.key(0), (16, 16, 16, 3))
  model = models.get_model('ViT-testing', num_classes=5, droppath_rate=0.5)
  variables = _perturbed_variables(model, images)
  eval_logits = model.apply(variables, images)
  train = lambda seed: model.apply(  # noqa: E731
      variables, images, train=True, rngs={'dropout': jax.random.key(seed)})
  assert not np.allclose(train(0), eval_logits)
  assert not np.allclose(train(0), train(1))
  no_droppath = model.clone(droppath_rate=0.0)
  np.testing.assert_allclose(no_droppath.apply(variables, images, train=True,
                                               rngs={'dropout': jax.random.key(0)}),
                             eval_logits, atol=1e-6)


def test_sincos2d_position_embedding_has_no_parameters(images):
  model = models.get_model('ViT-testing', num_classes=5, position_embedding='sincos2d')
  variables = model.init(jax.random.key(0), images)
  assert 'posembed_input' not in variables['params']['Transformer']
  assert model.apply(variables, images).shape == (2, 5)


@pytest.mark.parametrize('name', IMAGE_TESTING_MODELS)
def test_bfloat16_compute(name, images):
  model = models.get_model(name, num_classes=5, dropout_rate=0.0, droppath_rate=0.0,
                           **FAST.get(name, {}))
  variables = _perturbed_variables(model, images)
  reference = model.apply(variables, images)
  low = model.clone(dtype=jnp.bfloat16)
  out = jax.jit(low.apply)(variables, images)
  assert out.dtype == jnp.float32  # Logits come back in float32.
  assert jax.tree.all(jax.tree.map(lambda x: x.dtype == jnp.float32, variables))
  np.testing.assert_allclose(out, reference, atol=0.05 * float(jnp.abs(reference).max()))
  bf16_params = jax.eval_shape(low.clone(param_dtype=jnp.bfloat16).init, jax.random.key(0),
                               images)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf16_params))


def test_bfloat16_attention_and_encoder():
  x = jax.random.normal(jax.random.key(0), (2, 6, 16))
  for module in [models.MultiHeadDotProductAttention(num_heads=2),
                 models.EncoderBlock(mlp_dim=32, num_heads=2),
                 models.EncoderBlock(mlp_dim=32, num_heads=2, norm_position='post',
                                     activation='relu'),
                 models.Encoder(num_layers=2, mlp_dim=32, num_heads=2)]:
    variables = module.init(jax.random.key(1), x)
    reference = module.apply(variables, x)
    out = module.clone(dtype=jnp.bfloat16).apply(variables, x.astype(jnp.bfloat16))
    assert out.dtype == jnp.bfloat16, type(module).__name__
    np.testing.assert_allclose(out.astype(jnp.float32), reference, atol=0.1)


def test_bfloat16_activations_are_rounded_once():
  """GELU and ReLU of bfloat16 inputs: the exact value rounded to bfloat16, not a chain of
  bfloat16 roundings (one after each of the GELU's operations, as XLA:CPU computed it)."""
  # Below -3, float32 itself loses GELU's tail to cancellation (1 + tanh(...) near 0).
  inputs = jnp.linspace(-3.0, 6.0, 4097).astype(jnp.bfloat16)
  x = np.asarray(inputs, np.float64)
  tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
  exact = {'gelu': tanh_gelu, 'relu': np.maximum(x, 0.0)}
  assert set(exact) == set(layers.ACTIVATIONS)
  for name, values in exact.items():
    out = jax.jit(layers.activation_fn(name))(inputs)
    assert out.dtype == jnp.bfloat16, name
    differ = np.asarray(out != jnp.asarray(values, jnp.float32).astype(jnp.bfloat16))
    # float32's tanh may land on the other side of a rounding boundary, rarely.
    assert differ.mean() < 0.01, (name, differ.sum())
  # A model exported here for CPUs and GPUs, called here, rounds once too.
  exported = jax.export.export(jax.jit(layers.activation_fn('gelu')),
                               platforms=('cpu', 'cuda'))(inputs)
  np.testing.assert_array_equal(exported.call(inputs), jax.jit(layers.activation_fn('gelu'))(inputs))


def test_activations_on_gpus_and_in_float32_are_plain_flax():
  """Lowered for a GPU, bfloat16 activations are Flax's own (XLA keeps float32 intermediates
  there itself and may fuse the GELU into cuBLASLt's epilogue, which explicit conversions
  prevent), even where the model is traced on a CPU; float32 ones are Flax's everywhere."""
  def lowered(fn, x, platform):
    return jax.jit(fn).trace(x).lower(lowering_platforms=(platform,)).as_text()
  for dtype in (jnp.bfloat16, jnp.float16):
    x = jnp.linspace(-3.0, 6.0, 64).astype(dtype)
    assert 'f32' in lowered(layers.activation_fn('gelu'), x, 'cpu'), dtype
    assert 'f32' not in lowered(layers.activation_fn('gelu'), x, 'cuda'), dtype
  x = jnp.linspace(-3.0, 6.0, 64)
  jaxpr = jax.make_jaxpr(layers.activation_fn('gelu'))(x)
  assert str(jaxpr) == str(jax.make_jaxpr(layers.ACTIVATIONS['gelu'])(x))


def test_unknown_model_name_lists_known_models():
  with pytest.raises(ValueError) as error:
    models.get_model('ViT-B_17', num_classes=10)
  message = str(error.value)
  assert "Unknown model 'ViT-B_17'" in message and 'ViT-B_16' in message
  assert all(name in message for name in models.model_names())


def test_unknown_option_and_missing_class_count_are_clear_errors():
  with pytest.raises(ValueError, match=r"no option\(s\) \['num_head'\]"):
    models.get_model('ViT-B_16', num_classes=10, num_head=3)
  with pytest.raises(ValueError, match='needs num_classes'):
    models.get_model('ViT-B_16')
  with pytest.raises(ValueError, match='needs vocab_size'):
    models.get_model('Transformer-base')


def test_image_size_not_multiple_of_patch_size():
  model = models.get_model('ViT-B_16', num_classes=10)
  with pytest.raises(ValueError, match='Image size 200x224 is not a multiple of the patch '
                                       'size 16x16'):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 200, 224, 3)))
  hybrid = models.get_model('R26+ViT-S_32', num_classes=10)
  with pytest.raises(ValueError, match=r'Image size 48x48 is not a multiple of 32 \(the '
                                       r'ResNet stem\'s stride 32 x patch size 1x1\)'):
    jax.eval_shape(hybrid.init, jax.random.key(0), jnp.zeros((1, 48, 48, 3)))


def test_channels_first_images_say_how_to_make_them_nhwc():
  model = models.get_model('ViT-testing', num_classes=10)
  with pytest.raises(ValueError, match=r'got shape \(2, 3, 32, 32\), which looks channels-first '
                                       r'\(NCHW, as torch lays them out\): '
                                       r'images.transpose\(0, 2, 3, 1\) gives NHWC'):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2, 3, 32, 32)))


@pytest.mark.parametrize('name', ['ViT-testing', 'DeiT-testing'])
def test_weights_applied_to_images_of_another_size_say_how_to_fit_them(name):
  model = models.get_model(name, num_classes=10)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  extra = 2 if name.startswith('DeiT') else 1  # Class (and distillation) tokens.
  with pytest.raises(ValueError, match=rf'The position embedding holds {64 + extra} tokens of '
                                       rf'width 32, but the inputs give {256 + extra} of width 32: '
                                       r'.* vit_jax\.weights\.load_pretrained\(params, '):
    jax.eval_shape(model.apply, params, jnp.zeros((1, 64, 64, 3)))


def test_registry_covers_the_published_families():
  expected = {'ViT-Ti_16', 'ViT-S_16', 'ViT-S_32', 'ViT-B_16', 'ViT-B_32', 'ViT-L_16',
              'ViT-L_32', 'ViT-H_14', 'R50+ViT-B_16', 'R26+ViT-S_32', 'R+ViT-Ti_16',
              'DeiT-Ti_16', 'DeiT-S_16', 'DeiT-B_16', 'Transformer-base', 'Transformer-big',
              'ViT-testing', 'R+ViT-testing', 'DeiT-testing', 'Transformer-testing'}
  assert expected <= set(models.model_names())
  assert models.model_config('ViT-L_16')['num_layers'] == 24
