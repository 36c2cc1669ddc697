"""`trainer=predict`: what is in these pictures? The top classes of image files.

  python -m vit_jax.main --workdir=runs/digits --config.trainer=predict \
      --config.predict.inputs='digit.png,more_digits/'
  python -m vit_jax.main --config=configs/vit.py:ViT-B_16,imagenet2012 --config.trainer=predict \
      --config.pretrained=ViT-B_16.npz --config.predict.inputs='photos/*.jpg'

Weights come from the workdir's latest checkpoint, else from `config.pretrained` (a
published .npz, or another workdir). No dataset is built: images are read and preprocessed
like test images, the class count comes from the weights, and the class names from
WORKDIR/class_names.json (saved at training) or from the dataset's name
(`vit_jax.data.class_names`); unknown names are shown as class indices.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import errors, files, progress, weights
from vit_jax.data import class_names as class_names_lib
from vit_jax.data import images as image_data
from vit_jax.models import cast
from vit_jax.models.vit import stem_stride
from vit_jax.train import checkpointing, classification, config as config_lib

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.gif', '.bmp')
_GLOB_CHARACTERS = '*?['


def expand_inputs(spec: str) -> list[str]:
  """'a.png,photos/,shots/*.jpg' -> image paths: files as given, the images below each
  folder (sorted, recursively), the matches of each glob (sorted)."""
  items = [item.strip() for item in spec.split(',') if item.strip()]
  if not items:
    raise errors.ConfigError(
        "config.predict.inputs is empty: give image files, folders, globs or URLs separated "
        "by ',', e.g. --config.predict.inputs='cat.jpg,photos/'.")
  paths = []
  for item in items:
    if files.is_web(item):  # Read (or said to be missing) when predicted.
      paths.append(item)
    elif files.isdir(item):
      found, others = [], []
      for name in sorted(files.walk_files(item)):
        if not os.path.basename(name).startswith('.'):
          (found if name.lower().endswith(IMAGE_EXTENSIONS) else others).append(
              files.join(item, name))
      if not found:
        raise errors.MissingFileError(f'Folder {item} (config.predict.inputs) holds no '
                                      f'{"/".join(IMAGE_EXTENSIONS)} files.')
      if others:
        progress.log(f'Left out {len(others)} file(s) in {item} whose names do not end in '
                     f'{"/".join(IMAGE_EXTENSIONS)}, e.g. {", ".join(others[:3])} (name a file '
                     'in config.predict.inputs to read it whatever its name).')
      paths += found
    elif any(c in item for c in _GLOB_CHARACTERS):
      found = files.glob(item)
      if not found:
        raise errors.MissingFileError(f'No file matches {item!r} (config.predict.inputs).')
      paths += found
    elif not files.exists(item):
      raise errors.MissingFileError(f'Image file {item} (config.predict.inputs) does not exist.')
    else:
      paths.append(item)
  return paths


def _checkpoint_image_size(flat: dict, model) -> int | None:
  """The square image size that a checkpoint's position embedding was trained at."""
  side = weights.posemb_side(flat)
  return side * model.patch_size[0] * stem_stride(model.resnet_layers) if side else None


def load_model_and_params(config: ml_collections.ConfigDict, workdir: str | None):
  """(model, params, source) from WORKDIR's latest checkpoint or `config.pretrained`.

  The class count and pre-logits width come from the weights, every other field from
  `config.model`; the weights are fitted to `config.data.image_size` (the position
  embedding resized) and refused in one line when the model's shapes differ.
  """
  source = _read_checkpoint(config, workdir) if workdir is not None else None
  if source is not None:
    params, name = source
  elif not config.get('pretrained'):
    where = f'No checkpoint in {files.join(workdir, "checkpoints")} and no' if workdir else 'No'
    raise errors.MissingFileError(
        f'{where} config.pretrained: trainer={config.trainer} has no weights. Train first, or '
        'pass published weights with --config.pretrained=FILE.npz (and the model with '
        '--config=configs/vit.py:MODEL,DATASET).')
  elif config.use_ema:
    raise errors.ConfigError(f'config.use_ema reads the EMA weights of a checkpoint in '
                             f'--workdir, which has none; config.pretrained='
                             f'{config.pretrained!r} is read as it is: leave use_ema False.')
  else:
    name = config.pretrained
    params = classification.read_weights(name, fall_back=config.checkpoint_fallback)
  flat = weights.canonicalize(params)
  model = config_lib.build_model(config.model, **weights.head_fields(flat, name))
  image_shape = (config.data.image_size, config.data.image_size, config.data.channels)
  init = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, *image_shape))))
  native = _checkpoint_image_size(flat, model)
  if native and native != config.data.image_size:
    progress.log(f'{name} was trained at {native}x{native}; predicting at '
                 f'{config.data.image_size}x{config.data.image_size} (config.data.image_size) '
                 f'with its position embeddings resized. --config.data.image_size={native} '
                 'predicts at its own resolution.')
  return model, weights.load_pretrained(params, init['params'], source_name=name), name


def _read_checkpoint(config, workdir: str) -> tuple[dict, str] | None:
  """(params, description) of WORKDIR's latest checkpoint; None without one."""
  with checkpointing.Checkpointer(workdir, read_only=True) as checkpointer:
    if checkpointer.latest_step() is None:
      return None
    params, step = checkpointer.restore_params(
        fall_back=config.checkpoint_fallback, item='ema_params' if config.use_ema else 'params')
    ema = ' (EMA weights)' if config.use_ema else ''
    return params, f'{checkpointer.directory} at step {step}{ema}'


def class_names(config, workdir: str | None, num_classes: int) -> list[str]:
  """Each class's name: WORKDIR/class_names.json, else the dataset's (or the class index)."""
  names = class_names_lib.load(workdir) if workdir else None
  if names is None:
    names = class_names_lib.for_dataset(config.data)
  if names is not None and len(names) == num_classes:
    return list(names)
  if names is not None:
    progress.log(f'Note: {len(names)} class names for {config.data.dataset}, but the weights '
                 f'have {num_classes} classes; showing class indices.')
  return [str(i) for i in range(num_classes)]


def predict_files(model, params, paths: list[str], data_config,
                  batch_size: int) -> tuple[list[str], np.ndarray]:
  """(the paths predicted, their class probabilities (N, num_classes)), in fixed-size batches.

  A file that cannot be read as an image (truncated, empty, not an image) is left out, said
  in one line; BadFileError when none can be read.
  """
  def probabilities_of(p, x):
    return jax.nn.softmax(model.apply({'params': p}, x), axis=-1)

  apply = jax.jit(probabilities_of)
  stored = None  # `params` in the dtypes the model casts them to, made at the first batch.
  predicted, probabilities = [], []
  with progress.phase(f'Predicting {len(paths)} image(s)', total=len(paths),
                      unit='images') as phase:
    for start in range(0, len(paths), batch_size):
      chunk = paths[start:start + batch_size]
      readable, images = _read_images(chunk, data_config)
      phase.advance(len(chunk))
      if not readable:
        continue
      padded = np.concatenate([images, np.zeros((batch_size - len(readable), *images.shape[1:]),
                                                images.dtype)])  # One compiled shape.
      if stored is None:
        stored = cast.cast_as_used(probabilities_of, params, padded)
      probabilities.append(np.asarray(apply(stored, padded))[:len(readable)])
      predicted += readable
    skipped = len(paths) - len(predicted)
    if skipped:
      phase.result = f'{len(predicted):,} of {len(paths):,} images predicted, {skipped:,} skipped'
  if not predicted:
    raise errors.BadFileError(f'None of the {len(paths)} file(s) of config.predict.inputs is '
                              'an image that can be read.')
  return predicted, np.concatenate(probabilities)


def _read_images(paths: list[str], data_config) -> tuple[list[str], np.ndarray | None]:
  """(the readable ones of `paths`, their model inputs); each unreadable one said in a line."""
  readable, images = [], []
  for path in paths:
    try:
      images.append(image_data.load_files([path], data_config)[0])
      readable.append(path)
    except errors.BadFileError as error:
      progress.log(f'Skipped: {error}')
  return readable, np.stack(images) if images else None


def run(config: ml_collections.ConfigDict, workdir: str | None) -> list[dict]:
  """Prints the top `config.predict.top_k` classes of each input image; returns them.

  Each result is {'file', 'predictions': [{'class', 'name', 'probability'}, ...]}; with
  `config.predict.output_file` they are also written there, one JSON object per line.
  """
  settings = config.predict  # Its ranges are checked with the config's (config.MINIMUMS).
  paths = expand_inputs(settings.inputs)
  model, params, source = load_model_and_params(config, workdir)
  names = class_names(config, workdir, model.num_classes)
  progress.log(f'Weights: {source} ({config.model.name}, {model.num_classes} classes).')
  paths, probabilities = predict_files(model, params, paths, config.data,
                                       min(settings.batch_size, len(paths)))
  top_k = min(settings.top_k, model.num_classes)
  results = []
  for path, row in zip(paths, probabilities):
    best = np.argsort(-row, kind='stable')[:top_k]
    predictions = [{'class': int(c), 'name': names[c], 'probability': float(row[c])}
                   for c in best]
    results.append({'file': path, 'predictions': predictions})
    print(path)
    for p in predictions:
      label = p['name'] if p['name'] == str(p['class']) else f'{p["name"]} ({p["class"]})'
      print(f'  {100 * p["probability"]:6.2f}%  {label}')
  if settings.output_file:
    files.write_text_atomically(settings.output_file,
                                ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in results))
    progress.log(f'Wrote {settings.output_file}')
  return results
