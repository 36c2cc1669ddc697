"""`--mode seq2seq --profile`: where a Transformer train step's time goes, part by part.

Each part is compiled on its own at the benchmark's shape, on its batch (with --packed,
the packed rows and their segment masks), and the parts are timed alternating. They
overlap (the step holds them all, the backward pass included):

- train step: the trainer's step (loss, gradients, AdamW update), as `--mode seq2seq`;
- ... without dropout: the same step with dropout_rate 0 (the rest is dropout's cost);
- forward: the loss alone; forward + backward: the loss and its gradients;
- optimizer: the AdamW update (clipping included) from given gradients;
- attention: every attention call of the model (encoder, decoder self-, cross-) with the
  batch's masks, forward and backward, on the kernel the model runs;
- projection + loss: the tied output projection onto the vocabulary (`nn.Embed.attend` in
  the model's dtype, as the decoder computes its logits) and the token cross-entropy with
  label smoothing 0.1, forward and backward;
- embedding: the source and target embedding lookups, forward and backward;
- host batching: `packing.batch` making one batch from token ids on the host (numpy).
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.benchmark import seq2seq, steps, timing
from vit_jax.data import packing
from vit_jax.models import attention
from vit_jax.train.losses import cross_entropy


class _HostBatching(timing.Runner):
  """One `packing.batch` call per step, on the examples `packed_pairs` draws."""

  def __init__(self, args):
    rng = np.random.default_rng(1)
    self.examples, self.rows = seq2seq.packed_examples(rng, args.batch, args.seq_len,
                                                       args.vocab_size, args.sentence_length)
    self.max_length = args.seq_len

  def start(self):
    packing.batch(self.examples, self.rows, self.max_length, packed=True)
    return lambda: None


def _masks(batch: dict, num_layers: int) -> list:
  """The masks of every attention call of the model, as `Transformer` makes them."""
  inputs, targets = batch['inputs'] > 0, batch['targets'] > 0
  encoder = attention.make_padding_mask(inputs, inputs)
  decoder = attention.combine_masks(attention.make_padding_mask(targets, targets),
                                    attention.make_causal_mask(targets.shape[1]))
  cross = attention.make_padding_mask(targets, inputs)
  if 'inputs_segmentation' in batch:
    same = attention.make_segment_mask
    source, target = batch['inputs_segmentation'], batch['targets_segmentation']
    encoder = attention.combine_masks(encoder, same(source, source))
    decoder = attention.combine_masks(decoder, same(target, target))
    cross = attention.combine_masks(cross, same(target, source))
  return [encoder, decoder, cross] * num_layers


def benchmark_seq2seq_profile(args) -> dict:
  """Median milliseconds of each part (see the module docstring) and their share of the step."""
  overrides = steps.model_overrides(args)
  model = models.get_model(args.model, vocab_size=args.vocab_size, **overrides)
  batch, _ = seq2seq.batches(args)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), batch['inputs'], batch['targets'])['params']
  task = steps.Seq2SeqTask(model)
  task.config.label_smoothing = 0.1
  total = args.warmup + args.steps + 1
  train_step, tx = steps.train_step(task, total)
  no_dropout_step, _ = steps.train_step(steps.Seq2SeqTask(model.clone(dropout_rate=0.0)), total)
  rng = jax.random.PRNGKey(2)

  def loss(p):
    return task.loss(p, batch, rng, None)[0]

  grads = jax.jit(jax.grad(loss))(params)
  opt_state = jax.jit(tx.init)(params)

  def update(g, s, p):
    updates, s = tx.update(g, s, p)
    return jax.tree.map(jnp.add, p, updates), s

  width, heads = model.embed_dim, model.num_heads
  kernel_name = attention.resolve_attention_impl(model.attention_impl)
  kernel = attention.KERNELS[kernel_name]
  masks = _masks(batch, model.num_layers)
  shape = batch['targets'].shape + (heads, width // heads)  # (B, T, N, H)
  queries = jax.random.normal(jax.random.PRNGKey(3), shape)

  def attention_calls(q, masks):
    return sum(jnp.sum(kernel(q, q * 0.5, q * 0.25, m) ** 2) for m in masks)

  table = params['shared_embedding']['embedding']
  outputs = jax.random.normal(jax.random.PRNGKey(4), batch['targets'].shape + (width,))

  output_embedding = nn.Embed(table.shape[0], width, dtype=model.dtype)

  def projection_and_loss(y, table, targets):
    logits = output_embedding.apply({'params': {'embedding': table}}, y.astype(model.dtype),
                                    method='attend').astype(jnp.float32)  # (B, T, V)
    weights = (targets > 0).astype(jnp.float32)
    losses = cross_entropy(logits, targets, 0.1)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)

  def embedding(table, inputs, targets, y):
    return jnp.sum((jnp.take(table, inputs, axis=0) + jnp.take(table, targets, axis=0)) * y)

  state = steps.make_train_state(jax.tree.map(jnp.copy, params), tx)
  no_dropout_state = steps.make_train_state(jax.tree.map(jnp.copy, params), tx)
  options = args.xla_options
  ours = lambda fn, *a, donate=False: timing.OursRunner(  # noqa: E731
      fn, a, donate_state=donate, xla_options=options)
  runners = {
      'train step': ours(train_step, state, batch, None, donate=True),
      'train step without dropout': ours(no_dropout_step, no_dropout_state, batch, None,
                                         donate=True),
      'forward (loss)': ours(loss, params),
      'forward + backward': ours(jax.grad(loss), params),
      'optimizer update': ours(update, grads, opt_state, params),
      f'attention x{len(masks)} ({kernel_name}), fwd + bwd': ours(jax.grad(attention_calls),
                                                                  queries, masks),
      'projection + loss, fwd + bwd': ours(jax.grad(projection_and_loss, argnums=(0, 1)),
                                           outputs, table, batch['targets']),
      'embedding x2, fwd + bwd': ours(jax.grad(embedding), table, batch['inputs'],
                                      batch['targets'], outputs),
      'host batching': _HostBatching(args),
  }
  for runner in runners.values():
    for _ in range(args.warmup):
      runner()
  timings = timing.time_alternating(runners, args.steps, args.rounds, args.timing)
  medians = {name: float(np.median(t.times)) for name, t in timings.items()}
  step = medians['train step']
  return {'parts': {name: {'ms': 1e3 * s, 'share_of_step': s / step}
                    for name, s in medians.items()},
          'train_target_tokens_per_step': int(np.sum(np.asarray(batch['targets']) > 0)),
          'target_tokens_per_s': float(np.sum(np.asarray(batch['targets']) > 0)) / step}
