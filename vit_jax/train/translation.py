"""Translation with the seq2seq Transformer: the training task and `trainer=translate`.

The task plugs into the shared loop (`vit_jax.train.loop`); evaluation adds
decoded-text metrics (corpus BLEU with sacrebleu, exact match).
"""

import sys

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import decode, progress
from vit_jax.data import text, text_sources, tokenizers, vocabulary
from vit_jax.train import checkpointing, config as config_lib, distributed, shapes, task
from vit_jax.train.losses import cross_entropy


def _packing_kwargs(batch: dict) -> dict:
  if 'inputs_segmentation' not in batch:
    return {}
  return {'inputs_segmentation': batch['inputs_segmentation'],
          'targets_segmentation': batch['targets_segmentation'],
          'inputs_positions': batch['inputs_position'],
          'targets_positions': batch['targets_position']}


def encode_lines(tokenizer, lines: list[str], max_length: int) -> np.ndarray:
  """Token ids (len(lines), max_length), EOS-terminated, truncated to fit."""
  rows = np.zeros((len(lines), max_length), np.int32)
  for i, line in enumerate(lines):
    ids = list(tokenizer.encode(line))[:max_length - 1] + [tokenizers.EOS_ID]
    rows[i, :len(ids)] = ids
  return rows


class Translator:
  """Batched, jit-compiled decoding of text with a trained model."""

  def __init__(self, model, params, tokenizer, config: ml_collections.ConfigDict):
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.max_length = config.data.eval_max_length or config.data.max_length
    self.max_decode_length = config.max_decode_length or self.max_length
    self.batch_size = config.decode_batch_size
    self.beam_size = beam_size = config.beam_size
    alpha = config.length_penalty_alpha

    def run(params, inputs):
      if beam_size == 1:
        return decode.greedy_decode(model, params, inputs, max_length=self.max_decode_length)
      tokens, _ = decode.beam_search(model, params, inputs, max_length=self.max_decode_length,
                                     beam_size=beam_size, alpha=alpha)
      return tokens[:, 0]
    self._decode = jax.jit(run)

  def translate_ids(self, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Source ids (len(lines), max_length) and output ids (len(lines), max_decode_length)."""
    sources, outputs = [], []
    how = 'greedy' if self.beam_size == 1 else f'beam {self.beam_size}'
    unit = 'sentence' if len(lines) == 1 else 'sentences'
    with progress.phase(f'Decoding {len(lines):,} {unit} ({how})', total=len(lines),
                        unit=unit) as phase:
      for start in range(0, len(lines), self.batch_size):
        chunk = lines[start:start + self.batch_size]
        inputs = encode_lines(self.tokenizer, chunk + [''] * (self.batch_size - len(chunk)),
                              self.max_length)  # Fixed batch shape: one compilation.
        sources.append(inputs[:len(chunk)])
        outputs.append(np.asarray(self._decode(self.params, inputs))[:len(chunk)])
        phase.advance(len(chunk))
    return np.concatenate(sources), np.concatenate(outputs)

  def translate(self, lines: list[str]) -> list[str]:
    """One translation per line; an empty line gives an empty one. Lines longer than the
    source length are cut to it, said in a line."""
    long = [number for number, line in enumerate(lines, 1)
            if len(self.tokenizer.encode(line)) >= self.max_length]
    if long:
      progress.note(f'Note: {len(long)} line(s) (line {", ".join(map(str, long[:5]))}'
                   f'{", ..." if len(long) > 5 else ""}) have more than {self.max_length - 1} '
                   'tokens: only their start is translated. --config.data.eval_max_length '
                   'raises the limit.')
    sentences = [line for line in lines if line]
    if not sentences:
      return ['' for _ in lines]
    _, outputs = self.translate_ids(sentences)
    translations = iter(self.tokenizer.decode([int(t) for t in row]) for row in outputs)
    return [next(translations) if line else '' for line in lines]


def text_metrics(hypotheses: list[str], references: list[str]) -> dict:
  import sacrebleu  # pylint: disable=g-import-not-at-top
  bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
  exact = np.mean([h.strip() == r.strip() for h, r in zip(hypotheses, references)])
  return {'bleu': float(bleu), 'exact_match': float(exact)}


class TranslationTask(task.BatchedTask):
  """Model, data, loss and metrics of translation."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    super().__init__(config, text.build(config.data, workdir=workdir))
    self.tokenizer = self.data.tokenizer
    self.model = config_lib.build_model(config.model, vocab_size=self.tokenizer.vocab_size)
    self._translator = None  # Built by the first `extra_eval`.

  def init_params(self, rng):
    tokens = jnp.ones((1, self.config.data.max_length), jnp.int32)
    return self.model.init(rng, tokens, tokens)['params']

  def initial_params(self, rng, abstract_params):
    del rng, abstract_params
    return None  # No pretrained weights: fresh ones.

  def frozen_params(self):
    return None

  def loss(self, params, batch, rng, frozen):
    del frozen
    targets = batch['targets']
    logits = self.model.apply({'params': params}, batch['inputs'], targets, train=True,
                              rngs={'dropout': rng}, **_packing_kwargs(batch))
    weights = (targets > 0).astype(jnp.float32)
    num_tokens = jnp.maximum(jnp.sum(weights), 1.0)
    losses = cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           self.config.label_smoothing).reshape(targets.shape)
    accuracy = jnp.sum((jnp.argmax(logits, -1) == targets) * weights) / num_tokens
    return jnp.sum(losses * weights) / num_tokens, {'token_accuracy': accuracy}

  def loss_weight(self, batch):
    """A microbatch counts by its target tokens, as `loss` averages over them."""
    return jnp.sum(batch['targets'] > 0).astype(jnp.float32)

  def eval_sums(self, params, batch):
    targets = batch['targets']
    logits = self.model.apply({'params': params}, batch['inputs'], targets)
    weights = (targets > 0) * batch['mask'][:, None]
    losses = cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           targets.reshape(-1)).reshape(targets.shape)
    return {'loss': jnp.sum(losses * weights),
            'correct_tokens': jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
            'tokens': jnp.sum(weights)}

  def eval_summary(self, sums):
    tokens = max(float(sums['tokens']), 1.0)
    return {'loss': float(sums['loss']) / tokens,
            'token_accuracy': float(sums['correct_tokens']) / tokens}

  def extra_eval(self, params, mesh, in_flight=None) -> dict:
    """BLEU and exact match of the decoded test sources, and how many were decoded.

    Scores the first `num_eval_decode` test sentences of the whole split (0: all). Each
    process decodes the ones in its share on one of its devices; hypotheses and references
    are gathered, so every process reports the figures of the whole set.
    """
    # Each process decodes on one of its own devices, a batch at a time (one in flight).
    del mesh, in_flight
    pairs = self.data.eval_texts()
    if self.config.num_eval_decode:
      pairs = pairs[:distributed.first_n_share(len(pairs), self.config.num_eval_decode)]
    sources = [source for source, _ in pairs]
    references = [target for _, target in pairs]
    params = jax.device_put(multihost_utils.process_allgather(params, tiled=True),
                            jax.local_devices()[0])
    if self._translator is None:  # One jitted decoder for every evaluation of the run.
      self._translator = Translator(self.model, params, self.tokenizer, self.config)
    self._translator.params = params
    hypotheses = self._translator.translate(sources)
    for source, hypothesis, reference in list(zip(sources, hypotheses, references))[:3]:
      progress.log(f'  {source!r} -> {hypothesis!r} (reference {reference!r})')
    hypotheses = distributed.allgather_texts(hypotheses)
    return {**text_metrics(hypotheses, distributed.allgather_texts(references)),
            'num_decoded': float(len(hypotheses))}


def _read_lines(config) -> list[str]:
  """config.input_file's lines, or standard input's, as the corpus reader reads its files."""
  if config.input_file:
    return text_sources.read_lines(config.input_file, 'config.input_file')
  return text_sources.decode_lines(sys.stdin.buffer.read(), 'standard input')


def load_model_and_params(config: ml_collections.ConfigDict, workdir: str):
  """(tokenizer, model, params) of WORKDIR's latest checkpoint, refused in one line when
  `config.model` is not the model that wrote it."""
  tokenizer = vocabulary.load_tokenizer(config.data, workdir)
  model = config_lib.build_model(config.model, vocab_size=tokenizer.vocab_size)
  params, step = checkpointing.restore_params(workdir, config.checkpoint_fallback,
                                              config.use_ema)
  tokens = jnp.ones((1, 1), jnp.int32)
  expected = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, tokens))
  shapes.check_shapes(params, expected['params'], f'The checkpoint at step {step} in {workdir}',
                      shapes.SAVED_CONFIG_ADVICE)
  return tokenizer, model, params


def translate(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  """Translates lines from `config.input_file` or stdin to stdout with the latest checkpoint."""
  lines = _read_lines(config)  # Before the weights: a wrong file is said at once.
  tokenizer, model, params = load_model_and_params(config, workdir)
  outputs = Translator(model, params, tokenizer, config).translate(lines)
  for line in outputs:
    print(line)
  return outputs
