"""`--mode seq2seq`: Transformer training and greedy decoding, tokens/s.

Training is the trainer's step over the translation task's loss (target tokens counted).
Its batch is full rows of random tokens, or with --packed the trainer's packed rows
(`vit_jax.data.packing`) of random sentence pairs whose lengths spread around
--sentence-length; then the torch peer trains on padded rows of such pairs, of similar
length (as a length-bucketing loader makes them) and about as many target tokens.
decoding is greedy, with the key/value cache and without it (the whole decoder re-run for
every new token), each decode including encoding the source once, and with --beam-size K the
translate mode's beam search (`vit_jax.decode.beam_search`, K beams, alpha 0.6), whose
tokens/s count the non-padding tokens of each example's best hypothesis. With --compare torch,
`torch.nn.Transformer` of the same shape trains on the same batches, alternating with ours
(`torch_seq2seq`).
"""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import decode, models
from vit_jax.data import packing, tokenizers
from vit_jax.benchmark import memory, steps, timing, torch_seq2seq, trace


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


def packed_examples(rng: np.random.Generator, rows: int, max_length: int, vocab_size: int,
                    sentence_length: int) -> tuple[types.SimpleNamespace, list[np.ndarray]]:
  """Random sentence pairs, and the first `rows` rows the trainer's packing makes of them.

  Source lengths (EOS included) are log-normal around `sentence_length`, and a target's
  length is near its source's (a translation's), all within [2, max_length].
  Returns (what `packing.batch` reads of `packing.Examples`, the pairs of each row).
  """
  num = rows * (max_length // 2 + 1)  # More pairs than `rows` rows can hold.
  source = sentence_length * rng.lognormal(0.0, 0.5, num)
  target = source * rng.lognormal(0.0, 0.2, num)
  sides = {}
  for key, length in (('source', source), ('target', target)):
    length = np.clip(length.round().astype(np.int64), 2, max_length)
    ids = rng.integers(tokenizers.EOS_ID + 1, vocab_size, int(length.sum())).astype(np.int32)
    sides[key] = types.SimpleNamespace(ids=np.append(ids, np.int32(0)),
                                       starts=np.cumsum(length) - length, lengths=length)
  examples = types.SimpleNamespace(
      source=sides['source'], target=sides['target'], kept=np.arange(num),
      source_lengths=sides['source'].lengths, target_lengths=sides['target'].lengths)
  bounds = packing.pack(examples.source_lengths, examples.target_lengths, max_length)
  return examples, [np.arange(bounds[r], bounds[r + 1]) for r in range(rows)]


def packed_pairs(rng: np.random.Generator, rows: int, max_length: int, vocab_size: int,
                 sentence_length: int) -> tuple[dict, dict]:
  """Packed rows of random sentence pairs (`packed_examples`), and a padded batch for torch.

  The padded batch is what a length-bucketing loader gives torch: pairs of similar length
  (a window of the pairs sorted by length), about as many target tokens as the packed rows.
  Returns (the packed batch of `rows` rows, {'inputs', 'targets'}: one padded row a pair).
  """
  examples, row_pairs = packed_examples(rng, rows, max_length, vocab_size, sentence_length)
  packed = packing.batch(examples, row_pairs, max_length, packed=True)
  longest = np.maximum(examples.source_lengths, examples.target_lengths)
  by_length = np.argsort(longest, kind='stable')
  window = by_length[len(by_length) // 2:]  # From the median length up, to our tokens.
  count = int(np.searchsorted(np.cumsum(examples.target_lengths[window]),
                              np.sum(packed['targets'] > 0))) + 1
  window = window[:count]
  padded = packing.batch(examples, [np.array([i]) for i in window], int(longest[window].max()),
                         packed=False)
  return packed, padded


def batches(args) -> tuple[dict, dict]:
  """Our batch (on the device) and the torch peer's (numpy), of about the same tokens."""
  rng = np.random.default_rng(0)
  if args.packed:
    packed, padded = packed_pairs(rng, args.batch, args.seq_len, args.vocab_size,
                                  args.sentence_length)
    return {k: jax.device_put(v) for k, v in packed.items()}, padded
  shape = (args.batch, args.seq_len)
  batch = {'inputs': rng.integers(1, args.vocab_size, shape).astype(np.int32),
           'targets': rng.integers(1, args.vocab_size, shape).astype(np.int32)}
  return {k: jax.device_put(v) for k, v in batch.items()}, batch


def benchmark_seq2seq(args) -> dict:
  """Transformer training tokens/s and cached vs uncached greedy decoding tokens/s."""
  if args.compare == 'torch':
    torch_seq2seq.import_torch()  # Fails early, before anything is compiled.
  overrides = steps.model_overrides(args)
  model = models.get_model(args.model, vocab_size=args.vocab_size, **overrides)
  batch, peer_batch = batches(args)
  inputs, targets = batch['inputs'], batch['targets']
  with timing.said_if_slow(f'initialising the parameters of {args.model}'):
    params = jax.jit(model.init)(jax.random.PRNGKey(0), inputs, targets)['params']

  train_step, tx = steps.train_step(steps.Seq2SeqTask(model),
                                    total_steps=args.warmup + args.steps + 1,
                                    state_dtype=args.optimizer_state_dtype)
  cached, uncached = greedy_decoders(model, args.batch, args.seq_len, args.decode_length)
  options = args.xla_options
  runners = {
      'train': timing.OursRunner(train_step, (steps.make_train_state(
          jax.tree.map(jnp.copy, params), tx), batch, None), donate_state=True,
                                 xla_options=options, name='train step'),
      'decode_cached': timing.OursRunner(cached, (params, inputs), donate_state=False,
                                         xla_options=options, name='cached greedy decoding'),
      'decode_uncached': timing.OursRunner(uncached, (params, inputs), donate_state=False,
                                           xla_options=options,
                                           name='uncached greedy decoding'),
  }
  if args.beam_size:  # The translate mode's beam search (it may stop before the length).
    runners['decode_beam'] = timing.OursRunner(
        lambda p, x: decode.beam_search(model, p, x, max_length=args.decode_length,
                                        beam_size=args.beam_size, alpha=0.6)[0][:, 0],
        (params, inputs), donate_state=False, xla_options=options, name='beam search')
  if args.hlo_out:
    runners['train'].write_hlo(args.hlo_out)
  if args.compare == 'torch':
    fields = dataclasses.asdict(model)
    with timing.said_if_slow('building the torch peer'):
      runners['torch_train'] = torch_seq2seq.TorchSeq2SeqRunner(
          fields, args.vocab_size, peer_batch['inputs'], peer_batch['targets'], args.dtype)
    timing.progress(f'torch peer built on {runners["torch_train"].device}')
  for runner in runners.values():
    for _ in range(args.warmup):
      runner()
  memory_figures = {'device_peak_bytes': memory.device_peak_bytes(),
                    'process_peak_rss_bytes': memory.peak_rss_bytes()}
  timings = timing.time_alternating(runners, args.steps, args.rounds, args.timing)
  peak = timing.peak_tflops(args.dtype, args.peak_tflops)
  target_tokens = int(np.sum(np.asarray(targets) > 0))
  tokens = {'train': target_tokens, 'torch_train': int(np.sum(peer_batch['targets'] > 0)),
            'decode_cached': args.batch * args.decode_length,
            'decode_uncached': args.batch * args.decode_length}
  if 'decode_beam' in runners:  # The best hypotheses' tokens, not padding.
    tokens['decode_beam'] = max(int(np.sum(np.asarray(runners['decode_beam'].output) > 0)), 1)
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
  if args.trace:
    results['trace'] = trace.record(runners['train'], args.trace_steps, args.trace,
                                    hlo_text=runners['train'].compiled.as_text())
  return {**results, 'memory': memory_figures, 'peak_tflops': peak,
          'train_target_tokens_per_step': target_tokens,
          'torch_train_target_tokens_per_step': tokens['torch_train'],
          'torch_train_batch_shape': list(peer_batch['targets'].shape),
          'train_source_plus_target_tokens_per_s': 2 * results['train']['tokens_per_s'],
          'cached_over_uncached_decode_speed': (results['decode_cached']['tokens_per_s']
                                                / results['decode_uncached']['tokens_per_s']),
          'greedy_tokens_agree_cached_vs_uncached': float(agree)}
