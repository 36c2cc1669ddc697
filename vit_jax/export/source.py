"""What is exported: a classifier, its weights and metadata, from a workdir or a published .npz.

`load` builds the model for serving (plain per-layer attention, no scan, the asked compute
dtype) and fits the weights to it; `serving_function` is what every format exports.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

import vit_jax
from vit_jax import errors, files, models, weights
from vit_jax.data import class_names as class_names_lib, images, normalization
from vit_jax.export import preprocessing
from vit_jax.models import cast
from vit_jax.models.vit import stem_stride
from vit_jax.train import checkpointing, run_config

DTYPES = ('float32', 'bfloat16')
# Portable model settings: attention as einsums and a softmax, blocks as separate layers.
_SERVING_FIELDS = dict(attention_impl='plain', scan_layers=False, remat=False)


@dataclasses.dataclass(frozen=True)
class Resize:
  """How `--preprocess` resizes images: a run's config.data.eval_resize_ratio, eval_resize and
  eval_interpolation; a published .npz's default is Google's ViT eval (square, bilinear, 1)."""
  ratio: float = 1.0
  how: str = 'square'  # Or 'shorter_side'.
  interpolation: str = 'bilinear'  # Or 'bicubic'.

  @classmethod
  def of_config(cls, data_config) -> 'Resize':
    return cls(data_config.eval_resize_ratio, data_config.eval_resize,
               data_config.eval_interpolation)

  def check(self):
    """ConfigError, in one line, for values the eval pipeline does not have."""
    for flag, value, allowed in (('--eval-resize', self.how, images.EVAL_RESIZES),
                                 ('--eval-interpolation', self.interpolation,
                                  images.INTERPOLATIONS)):
      if value not in allowed:
        raise errors.ConfigError(f'{flag} {value} is not one of {", ".join(allowed)}.')
    if not self.ratio >= 1:
      raise errors.ConfigError(f'--eval-resize-ratio {self.ratio} must be at least 1 (1: resize '
                               'to the model\'s size; DeiT: 256/224 = 1.1428571).')


@dataclasses.dataclass(frozen=True)
class Exportable:
  """A model ready to export, with what its artifact's metadata says about it."""
  model: nn.Module
  params: dict
  model_name: str
  image_size: int
  channels: int
  resize: Resize
  pixel_mean: tuple[float, ...]  # Per channel, fractions of 255 (config.data.pixel_mean).
  pixel_std: tuple[float, ...]
  class_names: list[str]
  source: str  # Where the weights came from, for the metadata and the log.
  dtype: str

  def metadata(self, export_format: str, preprocess: bool, batch_size: int | None) -> dict:
    """The JSON-able description written beside each artifact."""
    batch = 'b' if batch_size is None else batch_size
    if preprocess:
      images = {'name': 'images', 'dtype': 'uint8', 'shape': [batch, 'h', 'w', self.channels],
                'range': '0..255, any height and width'}
    else:
      default = self.pixel_mean == self.pixel_std == (0.5,) * self.channels
      images = {'name': 'images', 'dtype': 'float32',
                'shape': [batch, self.image_size, self.image_size, self.channels],
                'range': '[-1, 1]' if default else '(pixels / 255 - pixel_mean) / pixel_std'}
    num_classes = len(self.class_names)
    outputs = [{'name': name, 'dtype': 'float32', 'shape': [batch, num_classes]}
               for name in ('logits', 'probabilities')]
    return {'format': export_format, 'model': self.model_name, 'image_size': self.image_size,
            'channels': self.channels, 'eval_resize_ratio': self.resize.ratio,
            'eval_resize': self.resize.how, 'eval_interpolation': self.resize.interpolation,
            'pixel_mean': list(self.pixel_mean), 'pixel_std': list(self.pixel_std),
            'preprocess': preprocess, 'dtype': self.dtype, 'inputs': [images],
            'outputs': outputs, 'class_names': self.class_names, 'source': self.source,
            'vit_jax_version': vit_jax.__version__}


def _native_image_size(flat: dict, model: nn.Module) -> int | None:
  side = weights.posemb_side(flat)
  return side * model.patch_size[0] * stem_stride(model.resnet_layers) if side else None


def _fit(model_name: str, fields: dict, flat: dict, source: str, image_size: int | None,
         channels: int, dtype: str):
  """(model, params, image_size) with the weights `flat` fitted at `image_size`."""
  model = models.get_model(model_name, **{**fields, **_SERVING_FIELDS, 'dtype': dtype,
                                          **weights.head_fields(flat, source)})
  if image_size is None:
    image_size = _native_image_size(flat, model)
    if image_size is None:
      raise errors.ConfigError(f'{source} has no learned position embedding to tell its image '
                               'size from: give --image-size.')
  if image_size < 1:
    raise errors.ConfigError(f'--image-size={image_size} must be at least 1.')
  step = math.lcm(*model.patch_size) * stem_stride(model.resnet_layers)  # Images are square.
  if image_size % step:
    raise errors.ConfigError(f'--image-size={image_size} is not a multiple of {step}, the '
                             f"{model_name}'s patch size (times its stem's stride); give a "
                             f'multiple of {step}, e.g. {max(step, image_size // step * step)}.')
  image_spec = jax.ShapeDtypeStruct((1, image_size, image_size, channels), jnp.float32)
  init = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(image_spec.shape)))
  params = weights.load_pretrained(flat, init['params'], source_name=source)
  # A bfloat16 model's weights stored in bfloat16 where it casts them: the same numbers from
  # an artifact about half the size.
  params = cast.cast_as_used(lambda p, x: model.apply({'params': p}, x, train=False), params,
                             image_spec)
  return model, params, image_size


def _statistics(mean, std, channels: int, where: str, flags: bool = False) -> tuple[tuple, tuple]:
  mean, std = normalization.statistics(mean, std, channels, where, flags)
  return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _from_workdir(workdir: str, model_name: str | None, ema: bool, image_size: int | None,
                  dtype: str, pixel_stats_given: bool, resize_given: bool,
                  fall_back: bool) -> Exportable:
  run_config.check_task(workdir, 'classification', 'SOURCE')
  config = run_config.load_config(workdir)
  if model_name is not None and model_name != config.model.name:
    raise errors.ConfigError(f'--model={model_name} names the model of a .npz SOURCE; the '
                             f'workdir {workdir} holds a {config.model.name}: leave --model out.')
  if pixel_stats_given:
    raise errors.ConfigError(
        f'--pixel-mean and --pixel-std describe a .npz SOURCE; the workdir {workdir} was trained '
        f'with config.data.pixel_mean={tuple(config.data.pixel_mean)} and pixel_std='
        f'{tuple(config.data.pixel_std)} (its config.json), which the export takes: leave them '
        'out.')
  if resize_given:
    data = config.data
    raise errors.ConfigError(
        f'--eval-resize, --eval-interpolation and --eval-resize-ratio describe a .npz SOURCE; '
        f'the workdir {workdir} evaluates with config.data.eval_resize={data.eval_resize!r}, '
        f'eval_interpolation={data.eval_interpolation!r} and eval_resize_ratio='
        f'{data.eval_resize_ratio:g} (its config.json), which the export takes: leave them out.')
  mean, std = _statistics(config.data.pixel_mean, config.data.pixel_std, config.data.channels,
                          f'{run_config.config_path(workdir)}: data.')
  params, step = checkpointing.restore_params(workdir, fall_back, ema=ema)
  flat = weights.canonicalize(params)
  fields = {key: value for key, value in config.model.items() if key != 'name'}
  what = f'{workdir} at step {step}' + (' (EMA weights)' if ema else '')
  model, params, image_size = _fit(config.model.name, fields, flat, what,
                                   config.data.image_size if image_size is None else image_size,
                                   config.data.channels, dtype)
  names = class_names_lib.load(workdir) or class_names_lib.for_dataset(config.data)
  return Exportable(model, params, config.model.name, image_size, config.data.channels,
                    Resize.of_config(config.data), mean, std,
                    _names(names, model.num_classes), what, dtype)


def _from_npz(path: str, model_name: str | None, ema: bool, image_size: int | None,
              dtype: str, pixel_mean, pixel_std, resize: Resize | None,
              fall_back: bool) -> Exportable:
  if model_name is None:
    raise errors.ConfigError(f'Exporting the .npz {path} needs the model it holds: give --model '
                             '(e.g. --model ViT-B_16).')
  for flag, given in (('--ema', ema), ('--checkpoint-fallback', fall_back)):
    if given:
      raise errors.ConfigError(f'{flag} reads the checkpoints of a workdir; {path} is a .npz, '
                               f'which holds one set of weights: leave {flag} out.')
  mean, std = _statistics(normalization.INCEPTION_MEAN if pixel_mean is None else pixel_mean,
                          normalization.INCEPTION_STD if pixel_std is None else pixel_std, 3,
                          '', flags=True)
  resize = resize or Resize()
  resize.check()
  flat = weights.canonicalize(weights.load_npz(path))
  model, params, image_size = _fit(model_name, {}, flat, path, image_size, 3, dtype)
  names = class_names_lib.imagenet2012() if model.num_classes == 1000 else None
  return Exportable(model, params, model_name, image_size, 3, resize, mean, std,
                    _names(names, model.num_classes), path, dtype)


def _names(names, num_classes: int) -> list[str]:
  if names is not None and len(names) == num_classes:
    return [str(name) for name in names]
  return [str(i) for i in range(num_classes)]


def load(source: str, *, model_name: str | None = None, ema: bool = False,
         image_size: int | None = None, dtype: str = 'float32', pixel_mean=None,
         pixel_std=None, resize: Resize | None = None, fall_back: bool = False) -> Exportable:
  """The classifier in `source`: a classification workdir (its latest checkpoint) or a
  published-layout .npz (with `model_name`), at `image_size` (default: its own).

  `pixel_mean` and `pixel_std` (fractions of 255, per channel or one for all) are a .npz's
  input statistics, by default 0.5 and 0.5 (Google's ViT: inputs in [-1, 1]), and `resize`
  how its `--preprocess` resizes (default `Resize()`); a workdir's come from its config.json.
  `fall_back`: a workdir whose latest checkpoint cannot be read gives its newest readable one.
  """
  if dtype not in DTYPES:
    raise errors.ConfigError(f'--dtype={dtype!r} is not one of {", ".join(DTYPES)}.')
  if files.isdir(source):
    return _from_workdir(source, model_name, ema, image_size, dtype,
                         pixel_mean is not None or pixel_std is not None, resize is not None,
                         fall_back)
  if source.endswith('.npz'):
    return _from_npz(source, model_name, ema, image_size, dtype, pixel_mean, pixel_std, resize,
                     fall_back)
  if not files.exists(source):
    raise errors.MissingFileError(f'SOURCE {source} does not exist; give a workdir or a .npz.')
  raise errors.ConfigError(f'SOURCE {source} is neither a workdir nor a .npz checkpoint.')


def serving_function(exportable: Exportable, preprocess: bool):
  """(params, images) -> {'logits', 'probabilities'} (float32 (B, num_classes)) of the model.

  With `preprocess`, images are uint8 (B, H, W, C) of any size, preprocessed as the eval
  pipeline does; otherwise float32 (B, image_size, image_size, C), normalized with the
  exportable's pixel_mean and pixel_std ([-1, 1] for 0.5 and 0.5).
  """
  model = exportable.model
  scale, offset = normalization.affine(exportable.pixel_mean, exportable.pixel_std,
                                       exportable.channels)

  def serve(params, images):
    if preprocess:
      resize = exportable.resize
      images = preprocessing.eval_images(images, exportable.image_size, resize.ratio, scale,
                                         offset, resize.how, resize.interpolation)
    logits = model.apply({'params': params}, images, train=False).astype(jnp.float32)
    return {'logits': logits, 'probabilities': jax.nn.softmax(logits, axis=-1)}

  return serve


def input_spec(exportable: Exportable, preprocess: bool, batch_size: int | None,
               ) -> jax.ShapeDtypeStruct:
  """The exported function's input: symbolic batch `b` unless `batch_size`; with
  `preprocess`, symbolic height `h` and width `w`."""
  channels = exportable.channels
  if preprocess:
    shape = jax.export.symbolic_shape(f'{batch_size or "b"}, h, w, {channels}')
    return jax.ShapeDtypeStruct(shape, jnp.uint8)
  size = exportable.image_size
  shape = jax.export.symbolic_shape(f'{batch_size or "b"}, {size}, {size}, {channels}')
  return jax.ShapeDtypeStruct(shape, jnp.float32)
