"""StableHLO: `jax.export`'s serialized module, the weights inside it as constants.

The artifact OUT/model.stablehlo is `jax.export.Exported.serialize()`'s bytes; any JAX (of a
version that reads its calling convention, see the metadata) runs it without this package:

  exported = jax.export.deserialize(bytearray(open('OUT/model.stablehlo', 'rb').read()))
  outputs = exported.call(images)  # {'logits', 'probabilities'}
"""

import os

import jax

from vit_jax.export import source as source_lib

FILE = 'model.stablehlo'


def export(exportable: source_lib.Exportable, preprocess: bool, batch_size: int | None):
  """The `jax.export.Exported` of the serving function, weights closed over."""
  serve = source_lib.serving_function(exportable, preprocess)
  return export_function(serve, exportable.params,
                         source_lib.input_spec(exportable, preprocess, batch_size))


def export_function(serve, params, spec: jax.ShapeDtypeStruct):
  """`jax.export` of `serve(params, input)` for inputs like `spec`, the params as constants."""
  return jax.export.export(jax.jit(lambda inputs: serve(params, inputs)),
                           platforms=('cpu', 'cuda', 'tpu'))(spec)


def write(directory: str, exportable: source_lib.Exportable, preprocess: bool,
          batch_size: int | None, metadata: dict) -> str:
  """Writes DIRECTORY/model.stablehlo; adds its calling convention to `metadata`."""
  return write_exported(directory, export(exportable, preprocess, batch_size), metadata)


def write_exported(directory: str, exported, metadata: dict) -> str:
  """Writes `exported` as DIRECTORY/model.stablehlo; its calling convention into `metadata`."""
  path = os.path.join(directory, FILE)
  with open(path, 'wb') as f:
    f.write(exported.serialize())
  metadata['calling_convention_version'] = exported.calling_convention_version
  metadata['platforms'] = list(exported.platforms)
  return path
