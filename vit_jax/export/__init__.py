"""Export a trained classifier for serving: StableHLO, TensorFlow SavedModel or ONNX.

  python -m vit_jax.export SOURCE OUT --format stablehlo|savedmodel|onnx [--model NAME]
      [--ema] [--batch-size N] [--dtype float32|bfloat16] [--preprocess] [--image-size S]
      [--pixel-mean M] [--pixel-std S] [--eval-resize square|shorter_side]
      [--eval-interpolation bilinear|bicubic] [--eval-resize-ratio R] [--checkpoint-fallback]
      [--overwrite]

SOURCE is a classification workdir (its latest checkpoint) or a published-layout .npz (with
--model). OUT is a directory: the artifact (`stablehlo`, `savedmodel`, `onnx` modules say
what) and OUT/metadata.json (model, image size, class names, inputs and outputs, version).
Each artifact computes {'logits', 'probabilities'}, float32 (B, classes), from `images`:
float32 (B, S, S, C) normalized as in training ([-1, 1] by default; metadata.json's
pixel_mean and pixel_std), or with `preprocess` uint8 (B, H, W, C) of any size, resized and
normalized as the eval pipeline does. The batch is symbolic unless `batch_size`.
OUT appears whole or not at all: it is written beside and renamed.
"""

import json
import os
import shutil

from vit_jax import errors, files, progress
from vit_jax.export import source as source_lib

FORMATS = ('stablehlo', 'savedmodel', 'onnx')
METADATA = 'metadata.json'


def _writer(export_format: str):
  from vit_jax.export import onnx, savedmodel, stablehlo  # pylint: disable=g-import-not-at-top
  return {'stablehlo': stablehlo, 'savedmodel': savedmodel, 'onnx': onnx}[export_format]


def check_arguments(out: str, export_format: str, batch_size: int | None, dtype: str,
                    overwrite: bool):
  """Raises a UserError for arguments that cannot work, before anything is read or written."""
  if export_format not in FORMATS:
    raise errors.ConfigError(f'--format={export_format!r} is not a known format; use one of '
                             f'{", ".join(FORMATS)}.')
  if dtype not in source_lib.DTYPES:
    raise errors.ConfigError(f'--dtype={dtype!r} is not one of {", ".join(source_lib.DTYPES)}.')
  if export_format == 'onnx' and dtype != 'float32':
    raise errors.ConfigError(f'--format onnx --dtype {dtype}: ONNX Runtime has no {dtype} '
                             'kernels for the einsums of attention; export ONNX in float32.')
  if batch_size is not None and batch_size < 1:
    raise errors.ConfigError(f'--batch-size={batch_size} must be at least 1 (leave it out '
                             'for a symbolic batch size).')
  if os.path.lexists(out) and not overwrite:
    raise errors.ConfigError(f'{out} already exists; pass --overwrite to replace it, or give '
                             'another OUT.')
  if os.path.lexists(out):
    files.check_replaceable(out, 'export (a directory with its metadata.json)', _is_export)
  if export_format == 'onnx':
    _writer('onnx').check_available()


def _is_export(path: str) -> bool:
  try:
    with open(os.path.join(path, METADATA), encoding='utf-8') as f:
      return 'format' in json.load(f)
  except (OSError, ValueError, TypeError):
    return False


def export(source: str, out: str, export_format: str, *, model_name: str | None = None,
           ema: bool = False, batch_size: int | None = None, dtype: str = 'float32',
           preprocess: bool = False, image_size: int | None = None,
           overwrite: bool = False, pixel_mean=None, pixel_std=None,
           resize: source_lib.Resize | None = None, fall_back: bool = False) -> dict:
  """Writes the classifier in SOURCE to the directory OUT as `export_format`; returns the
  metadata written to OUT/metadata.json. A translation workdir exports its greedy translation
  (`vit_jax.export.translation`). `resize` (a .npz's, with `preprocess`): see
  `source.Resize`."""
  from vit_jax.export import translation  # pylint: disable=g-import-not-at-top
  if translation.is_translation_workdir(source):
    translation.check_arguments(export_format, model_name, preprocess, image_size, pixel_mean,
                                pixel_std, resize)
    check_arguments(out, export_format, batch_size, dtype, overwrite)
    model = translation.Translation(source, ema, dtype, fall_back)
    progress.log(f'Exporting greedy translation of {model.config.model.name} ({dtype}) from '
                 f'{model.source} as {export_format}.')
    metadata = model.metadata(export_format, batch_size)
    return _write_whole(out, lambda staging: translation.write(
        staging, model, export_format, batch_size, metadata), metadata)
  check_arguments(out, export_format, batch_size, dtype, overwrite)
  if resize is not None and not preprocess:
    raise errors.ConfigError('--eval-resize, --eval-interpolation and --eval-resize-ratio say '
                             'how --preprocess resizes images: add --preprocess, or leave them '
                             'out.')
  exportable = source_lib.load(source, model_name=model_name, ema=ema, image_size=image_size,
                               dtype=dtype, pixel_mean=pixel_mean, pixel_std=pixel_std,
                               resize=resize, fall_back=fall_back)
  progress.log(f'Exporting {exportable.model_name} ({len(exportable.class_names)} classes, '
               f'{exportable.image_size}x{exportable.image_size}, {dtype}) from '
               f'{exportable.source} as {export_format}.')
  metadata = exportable.metadata(export_format, preprocess, batch_size)
  return _write_whole(out, lambda staging: _writer(export_format).write(
      staging, exportable, preprocess, batch_size, metadata), metadata)


def _write_whole(out: str, write, metadata: dict) -> dict:
  """`write(staging)` (-> the artifact's path) and metadata.json, renamed to OUT when done."""
  staging = files.staging_dir(out)
  try:
    artifact = write(staging)
    metadata['artifact'] = os.path.relpath(artifact, staging)
    with open(os.path.join(staging, METADATA), 'w', encoding='utf-8') as f:
      json.dump(metadata, f, ensure_ascii=False, indent=1)
    files.replace_with_dir(staging, out)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return metadata
