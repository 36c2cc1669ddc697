"""`--compile-depth`: compile time of a deep model with `scan_layers` against 4 layers.

The deep model is also compiled unrolled (unless --no-unrolled); each configuration is
traced, lowered and compiled `--compile-repeats` times, alternating, and the best kept.
"""

import time

import jax
import jax.numpy as jnp

from vit_jax import models
from vit_jax.benchmark import steps


def benchmark_compile_depth(args) -> dict:
  """Compile time of the deep model (scanned, and unrolled) vs a 4-layer model."""
  deep = models.model_config(args.depth_model)['num_layers']
  configs = [('shallow_scan', 4, True), ('deep_scan', deep, True)]
  if not args.no_unrolled:
    configs.append(('deep_unrolled', deep, False))

  def compile_once(num_layers, scan):
    model = models.get_model(args.depth_model, num_classes=steps.NUM_CLASSES,
                             **{**steps.model_overrides(args), 'num_layers': num_layers,
                                'scan_layers': scan})
    images = jax.ShapeDtypeStruct((args.batch, args.resolution, args.resolution, 3),
                                  jnp.float32)
    params = jax.eval_shape(lambda r, x: model.init(r, x)['params'],
                            jax.random.PRNGKey(0), images)
    if args.mode == 'train':
      fn, tx = steps.train_step(steps.ImageTask(model), total_steps=10)
      state = jax.eval_shape(lambda p: steps.make_train_state(p, tx), params)
      fn_args = (state, {'image': images,
                         'label': jax.ShapeDtypeStruct((args.batch,), jnp.int32)}, None)
    else:
      fn = lambda p, x: model.apply({'params': p}, x)  # noqa: E731
      fn_args = (params, images)
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*fn_args)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    lowered.compile(compiler_options=args.xla_options or None)
    return lower_s, time.perf_counter() - start

  compile_once(1, True)  # Warms up the compiler so that the first timed run is not special.
  results = {name: {'num_layers': layers, 'scan_layers': scan, 'runs': []}
             for name, layers, scan in configs}
  for _ in range(args.compile_repeats):  # Alternating, the best of the repeats.
    for name, layers, scan in configs:
      results[name]['runs'].append(compile_once(layers, scan))
  for entry in results.values():
    best = min(entry['runs'], key=sum)
    entry.update(lower_s=best[0], compile_s=best[1], total_s=sum(best))
  ratio = results['deep_scan']['total_s'] / results['shallow_scan']['total_s']
  summary = {'model': args.depth_model, 'mode': args.mode, **results,
             'deep_scan_over_shallow_scan': ratio}
  if 'deep_unrolled' in results:
    summary['deep_unrolled_over_shallow_scan'] = (results['deep_unrolled']['total_s']
                                                  / results['shallow_scan']['total_s'])
  return summary
