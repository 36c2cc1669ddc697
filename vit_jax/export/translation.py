"""Greedy translation of a seq2seq workdir, exported: token ids in, token ids out.

The exported function is `vit_jax.decode.greedy_decode` (the key/value cache inside its
`while_loop`): `inputs` int32 (B, L), the source ids EOS-terminated and 0-padded to the
workdir's eval length L, -> `tokens` int32 (B, T), 0 after EOS. The tokenizer file is copied
beside the artifact and named in the metadata, so a client encodes and decodes as the
trainer does. StableHLO (`model.stablehlo`) and SavedModel (`serving_default`) only.
"""

import os
import shutil

import jax
import jax.numpy as jnp

import vit_jax
from vit_jax import decode, errors, files
from vit_jax.data import tokenizers, vocabulary
from vit_jax.export import savedmodel, stablehlo
from vit_jax.train import checkpointing, config as config_lib, run_config

FORMATS = ('stablehlo', 'savedmodel')


def is_translation_workdir(source: str) -> bool:
  path = run_config.config_path(source)
  if not (os.path.isdir(source) and files.exists(path)):
    return False
  return run_config.load_config(source).task == 'translation'


class Translation:
  """A translation workdir's model, weights, tokenizer and lengths, ready to export."""

  def __init__(self, workdir: str, ema: bool, dtype: str, fall_back: bool = False):
    config = run_config.load_config(workdir)
    self.config = config
    self.tokenizer = vocabulary.load_tokenizer(config.data, workdir)
    self.tokenizer_path = tokenizers.vocabulary_path(config.data.tokenizer, workdir)
    model_config = config.model.copy_and_resolve_references()
    model_config.attention_impl = 'plain'  # Portable: einsums and a softmax.
    model_config.dtype = dtype
    self.model = config_lib.build_model(model_config, vocab_size=self.tokenizer.vocab_size)
    self.params, step = checkpointing.restore_params(workdir, fall_back, ema=ema)
    self.input_length = config.data.eval_max_length or config.data.max_length
    self.output_length = config.max_decode_length or self.input_length
    self.source = f'{workdir} at step {step}' + (' (EMA weights)' if ema else '')
    self.dtype = dtype

  def translate(self, params, inputs):
    return {'tokens': decode.greedy_decode(self.model, params, inputs,
                                           max_length=self.output_length)}

  def input_spec(self, batch_size: int | None) -> jax.ShapeDtypeStruct:
    batch = jax.export.symbolic_shape('b')[0] if batch_size is None else batch_size
    return jax.ShapeDtypeStruct((batch, self.input_length), jnp.int32)

  def metadata(self, export_format: str, batch_size: int | None) -> dict:
    batch = 'b' if batch_size is None else batch_size
    return {'format': export_format, 'model': self.config.model.name, 'task': 'translation',
            'decoding': 'greedy', 'dtype': self.dtype,
            'inputs': [{'name': 'inputs', 'dtype': 'int32', 'shape': [batch, self.input_length],
                        'range': 'source token ids, EOS (1) at the end, 0 after it'}],
            'outputs': [{'name': 'tokens', 'dtype': 'int32',
                         'shape': [batch, self.output_length],
                         'range': 'output token ids, 0 after EOS (1)'}],
            'tokenizer': self.config.data.tokenizer,
            'tokenizer_file': os.path.basename(self.tokenizer_path or '') or None,
            'vocab_size': self.tokenizer.vocab_size, 'source': self.source,
            'vit_jax_version': vit_jax.__version__}


def check_arguments(export_format: str, model_name, preprocess: bool, image_size,
                    pixel_mean=None, pixel_std=None, resize=None):
  """The options that do not apply to a translation workdir are errors."""
  if export_format not in FORMATS:
    raise errors.ConfigError(f'--format {export_format}: a translation workdir exports as '
                             f'{" or ".join(FORMATS)}.')
  given = [flag for flag, value in (('--model', model_name), ('--preprocess', preprocess),
                                    ('--image-size', image_size), ('--pixel-mean', pixel_mean),
                                    ('--pixel-std', pixel_std),
                                    ('--eval-resize/-interpolation/-resize-ratio', resize))
           if value]
  if given:
    raise errors.ConfigError(f'{", ".join(given)} applies to image classifiers; a translation '
                             'workdir exports token ids in and out: leave it out.')


def write(directory: str, translation: Translation, export_format: str,
          batch_size: int | None, metadata: dict) -> str:
  """Writes the artifact and the tokenizer file into DIRECTORY; returns the artifact's path."""
  if translation.tokenizer_path:
    shutil.copy(translation.tokenizer_path, directory)
  spec = translation.input_spec(batch_size)
  if export_format == 'stablehlo':
    exported = stablehlo.export_function(translation.translate, translation.params, spec)
    return stablehlo.write_exported(directory, exported, metadata)
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  module, serving_default = savedmodel.serving_module(translation.translate, translation.params,
                                                      spec, 'inputs')
  tf.saved_model.save(module, directory, signatures={'serving_default': serving_default})
  return directory
