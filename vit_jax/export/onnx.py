"""ONNX through jax2onnx: the serving function's graph, the weights as initializers.

OUT/model.onnx has input `images` and outputs `logits`, `probabilities`; the metadata is also
in its metadata_props (key `vit_jax`, the JSON). ONNX Runtime runs it:

  session = onnxruntime.InferenceSession('OUT/model.onnx')
  logits, probabilities = session.run(None, {'images': images})
"""

import importlib.util
import json
import os

import jax
import numpy as np

from vit_jax import errors
from vit_jax.export import source as source_lib
from vit_jax.models import resnet

FILE = 'model.onnx'
METADATA_KEY = 'vit_jax'
# The most |ONNX Runtime - JAX| logits may differ on the probe batch, per compute dtype.
TOLERANCE = {'float32': 1e-3, 'bfloat16': 0.1}


def _jax2onnx():
  try:
    import jax2onnx  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.MissingPackageError("--format onnx needs jax2onnx and onnxruntime: pip install "
                                     "'vit_jax[export]' (or pip install jax2onnx "
                                     'onnxruntime).') from None
  return jax2onnx


def check_available():
  """Raises MissingPackageError (one line: what to install) unless jax2onnx and onnxruntime
  import."""
  _jax2onnx()
  if importlib.util.find_spec('onnxruntime') is None:
    raise errors.MissingPackageError("--format onnx checks the graph with onnxruntime: pip "
                                     "install 'vit_jax[export]' (or pip install onnxruntime).")


def _with_standardized_kernels(params: dict) -> dict:
  """`params` with the hybrid ResNet's StdConv kernels standardized.

  jax2onnx (0.17) converts a linen Conv from the kernel as stored, past StdConv's
  standardization; given standardized kernels, its graph computes what the model does.
  `_check` confirms it on every export.
  """
  def standardize(path, value):
    return resnet.standardize(value) if path[-1].key == 'kernel' else value

  return {key: jax.tree_util.tree_map_with_path(standardize, value)
          if key == 'conv_root' or key.startswith('block') else value
          for key, value in params.items()}


def _probe(spec, exportable: source_lib.Exportable) -> np.ndarray:
  """A random input of the exported function's kind (uint8 images 3 pixels too large)."""
  batch = spec.shape[0] if isinstance(spec.shape[0], int) else 2
  rng = np.random.RandomState(0)
  if spec.dtype == np.uint8:
    side = exportable.image_size + 3
    return rng.randint(0, 256, (batch, side, side, exportable.channels)).astype(np.uint8)
  return rng.uniform(-1, 1, (batch, *spec.shape[1:])).astype(np.float32)


def _check(model_bytes: bytes, serve, exportable: source_lib.Exportable, spec):
  """Raises RuntimeError unless ONNX Runtime's logits on a probe batch equal the JAX model's."""
  import onnxruntime  # pylint: disable=g-import-not-at-top
  images = _probe(spec, exportable)
  session = onnxruntime.InferenceSession(model_bytes, providers=['CPUExecutionProvider'])
  got = session.run(['logits'], {'images': images})[0]
  want = np.asarray(jax.jit(serve)(exportable.params, images)['logits'])
  difference = float(np.abs(got - want).max())
  if not difference <= TOLERANCE[exportable.dtype]:
    raise RuntimeError(f'The ONNX graph of {exportable.model_name} computes other logits than '
                       f'the JAX model (max |difference| {difference:.3g} on a probe batch of '
                       f'{images.shape}): a converter bug.')


def write(directory: str, exportable: source_lib.Exportable, preprocess: bool,
          batch_size: int | None, metadata: dict) -> str:
  """Writes DIRECTORY/model.onnx, `metadata` in its metadata_props; returns its path.

  The graph is first checked against the JAX model with ONNX Runtime on a probe batch.
  """
  jax2onnx = _jax2onnx()
  serve = source_lib.serving_function(exportable, preprocess)
  params = _with_standardized_kernels(exportable.params)

  def outputs(images):
    result = serve(params, images)
    return result['logits'], result['probabilities']

  spec = source_lib.input_spec(exportable, preprocess, batch_size)
  model = jax2onnx.to_onnx(outputs, [spec], model_name=exportable.model_name,
                           input_names=['images'], output_names=['logits', 'probabilities'])
  entry = model.metadata_props.add()
  entry.key, entry.value = METADATA_KEY, json.dumps(metadata, ensure_ascii=False)
  model_bytes = model.SerializeToString()
  _check(model_bytes, serve, exportable, spec)
  path = os.path.join(directory, FILE)
  with open(path, 'wb') as f:
    f.write(model_bytes)
  return path
