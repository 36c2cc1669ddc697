"""`--mode seq2seq`: Transformer training and greedy decoding, tokens/s.

Training is the trainer's step over the translation task's loss (target tokens counted);
decoding is greedy, with the key/value cache and without it (the whole decoder re-run for
every new token), each decode including encoding the source once. With --compare torch,
`torch.nn.Transformer` of the same shape trains on the same batches, alternating with ours
(`torch_seq2seq`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.benchmark import memory, steps, timing, torch_seq2seq


def greedy_decoders(model, batch: int, src_len: int, length: int):
  """Jittable greedy decoders (params, inputs) -> tokens (B, length), with/without cache.

  Generated tokens skip id 0 (padding, also the start token) so that every
  position stays a valid query in the uncached re-run.
  """
  decoder = model.clone(cached_decoding=True)
  inputs_shape = jax.ShapeDtypeStruct((batch, src_len), jnp.int32)
  targets_shape = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  cache_shapes = jax.eval_shape(decoder.init, jax.random.PRNGKey(0), inputs_shape,
                                targets_shape)['cache']

  def pick(logits):  # (B, V) -> (B,), never the padding id 0.
    return (jnp.argmax(logits[:, 1:], axis=-1) + 1).astype(jnp.int32)

  def cached(params, inputs):
    encoded = model.apply({'params': params}, inputs, method='encode')
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)

    def step(carry, _):
      cache, token = carry
      logits, updated = decoder.apply({'params': params, 'cache': cache}, encoded, inputs,
                                      token, method='decode', mutable=['cache'])
      token = pick(logits[:, -1])
      return (updated['cache'], token[:, None]), token

    # The first step adds the cross-attention keys/values to the cache; the scan follows.
    carry, first = step((cache, jnp.zeros((batch, 1), jnp.int32)), None)
    _, rest = jax.lax.scan(step, carry, None, length=length - 1)
    return jnp.concatenate([first[None], rest]).T

  def uncached(params, inputs):
    encoded = model.apply({'params': params}, inputs, method='encode')

    def step(targets, t):
      logits = model.apply({'params': params}, encoded, inputs, targets, method='decode')
      token = pick(jax.lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False))
      return jax.lax.dynamic_update_index_in_dim(targets, token, t, axis=1), token

    placeholder = jnp.ones((batch, length), jnp.int32)  # Not yet generated; never seen.
    _, tokens = jax.lax.scan(step, placeholder, jnp.arange(length))
    return tokens.T

  return cached, uncached


def benchmark_seq2seq(args) -> dict:
  """Transformer training tokens/s and cached vs uncached greedy decoding tokens/s."""
  overrides = steps.model_overrides(args)
  model = models.get_model(args.model, vocab_size=args.vocab_size, **overrides)
  rng = np.random.default_rng(0)
  shape = (args.batch, args.seq_len)
  inputs = jax.device_put(rng.integers(1, args.vocab_size, shape).astype(np.int32))
  targets = jax.device_put(rng.integers(1, args.vocab_size, shape).astype(np.int32))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), inputs, targets)['params']

  train_step, tx = steps.train_step(steps.Seq2SeqTask(model),
                                    total_steps=args.warmup + args.steps + 1)
  batch = {'inputs': inputs, 'targets': targets}
  cached, uncached = greedy_decoders(model, args.batch, args.seq_len, args.decode_length)
  options = args.xla_options
  runners = {
      'train': timing.OursRunner(train_step, (steps.make_train_state(
          jax.tree.map(jnp.copy, params), tx), batch, None), donate_state=True,
                                 xla_options=options),
      'decode_cached': timing.OursRunner(cached, (params, inputs), donate_state=False,
                                         xla_options=options),
      'decode_uncached': timing.OursRunner(uncached, (params, inputs), donate_state=False,
                                           xla_options=options),
  }
  if args.compare == 'torch':
    fields = dataclasses.asdict(model)
    runners['torch_train'] = torch_seq2seq.TorchSeq2SeqRunner(
        fields, args.vocab_size, np.asarray(inputs), np.asarray(targets))
  for runner in runners.values():
    for _ in range(args.warmup):
      runner()
  memory_figures = {'device_peak_bytes': memory.device_peak_bytes(),
                    'process_peak_rss_bytes': memory.peak_rss_bytes()}
  timings = timing.time_alternating(runners, args.steps, args.rounds)
  peak = timing.peak_tflops(args.dtype, args.peak_tflops)
  tokens = {'train': args.batch * args.seq_len, 'torch_train': args.batch * args.seq_len,
            'decode_cached': args.batch * args.decode_length,
            'decode_uncached': args.batch * args.decode_length}
  results = {}
  for name, times in timings.items():
    summary = times.summary(tokens[name])
    summary['tokens_per_s'] = summary.pop('items_per_s')
    if name == 'torch_train':
      results[name] = {**summary, 'torch_threads': runners[name].threads}
      continue
    results[name] = {**summary, 'compile_s': runners[name].compile_s,
                     'xla_memory_analysis': runners[name].memory_analysis,
                     **timing.throughput_figures(runners[name].macs, summary['step_s_median'],
                                                 peak if name == 'train' else None)}
  agree = np.mean(np.asarray(runners['decode_cached'].output)
                  == np.asarray(runners['decode_uncached'].output))
  if 'torch_train' in results:
    results['ours_over_torch_train_tokens_per_s'] = (results['train']['tokens_per_s']
                                                     / results['torch_train']['tokens_per_s'])
  return {**results, 'memory': memory_figures, 'peak_tflops': peak,
          'train_source_plus_target_tokens_per_s': 2 * results['train']['tokens_per_s'],
          'cached_over_uncached_decode_speed': (results['decode_cached']['tokens_per_s']
                                                / results['decode_uncached']['tokens_per_s']),
          'greedy_tokens_agree_cached_vs_uncached': float(agree)}
