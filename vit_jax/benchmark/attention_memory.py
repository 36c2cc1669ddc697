"""`--attention-memory`: ViT forward memory per attention path at growing token counts.

From XLA's compiled memory analysis (deterministic: the buffers XLA allocates; nothing
is run), batch 1.
"""

import jax
import jax.numpy as jnp

from vit_jax import models
from vit_jax.benchmark import memory, steps, timing


def benchmark_attention_memory(args) -> dict:
  """Forward-pass memory per attention path and token count (XLA memory analysis)."""
  rows = []
  patch = models.model_config(args.model)['patch_size'][0]
  for resolution in args.resolutions:
    tokens = (resolution // patch) ** 2 + 1
    row = {'resolution': resolution, 'tokens': tokens}
    for impl in args.memory_impls:
      model = models.get_model(args.model, num_classes=steps.NUM_CLASSES,
                               **{**steps.model_overrides(args), 'attention_impl': impl})
      images = jax.ShapeDtypeStruct((1, resolution, resolution, 3), jnp.float32)
      params = jax.eval_shape(lambda r, x, m=model: m.init(r, x)['params'],
                              jax.random.PRNGKey(0), images)
      apply = jax.jit(lambda p, x, m=model: m.apply({'params': p}, x))
      compiled, compile_s = timing.compile_jitted(apply, params, images,
                                                  options=args.xla_options)
      row[impl] = {**memory.memory_analysis(compiled), 'compile_s': compile_s}
    rows.append(row)
  return {'method': 'XLA compiled memory_analysis (temp + argument + output - alias)',
          'batch': 1, 'rows': rows}
