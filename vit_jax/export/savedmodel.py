"""TensorFlow SavedModel through jax2tf (native serialization: the StableHLO in an XlaCallModule).

The weights are TF variables (OUT/variables), the metadata an asset (OUT/assets/metadata.json).
One signature, `serving_default`: input `images` (float32 (B, S, S, C), normalized as
metadata.json says, or uint8 (B, H, W, C) with `--preprocess`), outputs `logits` and `probabilities`, float32 (B, classes).

  model = tf.saved_model.load('OUT')
  outputs = model.signatures['serving_default'](images=images)
"""

import json
import os
import tempfile

import jax

from vit_jax.export import source as source_lib

ASSET = 'metadata.json'


def _polymorphic_shape(spec: jax.ShapeDtypeStruct) -> str:
  return '(' + ', '.join(str(dim) for dim in spec.shape) + ')'


def serving_module(serve, params, spec: jax.ShapeDtypeStruct, input_name: str):
  """(tf.Module holding `params` as variables, its `serving_default` tf.function of one input
  `input_name` like `spec`) for `serve(params, input)`, through jax2tf."""
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  converted = jax2tf.convert(serve, polymorphic_shapes=[None, _polymorphic_shape(spec)],
                             native_serialization_platforms=('cpu', 'cuda', 'tpu'),
                             with_gradient=False)
  module = tf.Module()
  module.params = tf.nest.map_structure(tf.Variable, params)
  signature = tf.TensorSpec([d if isinstance(d, int) else None for d in spec.shape],
                            tf.as_dtype(spec.dtype), name=input_name)

  @tf.function(input_signature=[signature], autograph=False)
  def serving_default(inputs):
    return converted(module.params, inputs)

  module.serving_default = serving_default
  return module, serving_default


def write(directory: str, exportable: source_lib.Exportable, preprocess: bool,
          batch_size: int | None, metadata: dict) -> str:
  """Writes the SavedModel into DIRECTORY, the metadata as its asset; returns DIRECTORY."""
  from vit_jax.data.tf_cpu import tf  # pylint: disable=g-import-not-at-top
  serve = source_lib.serving_function(exportable, preprocess)
  spec = source_lib.input_spec(exportable, preprocess, batch_size)
  module, serving_default = serving_module(serve, exportable.params, spec, 'images')
  with tempfile.TemporaryDirectory() as asset_dir:  # save() copies it to DIRECTORY/assets.
    asset_path = os.path.join(asset_dir, ASSET)
    with open(asset_path, 'w', encoding='utf-8') as f:
      json.dump(metadata, f, ensure_ascii=False, indent=1)
    module.metadata = tf.saved_model.Asset(asset_path)
    tf.saved_model.save(module, directory, signatures={'serving_default': serving_default})
  return directory
