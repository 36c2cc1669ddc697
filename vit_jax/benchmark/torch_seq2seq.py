"""`--mode seq2seq --compare torch`: `torch.nn.Transformer` of our shape, stepping like ours.

The peer has our model's shape: width, heads, layers (encoder and decoder), MLP width,
activation, dropout, pre- or post-LayerNorm, one embedding shared by source, target and the
output projection, scaled by sqrt(width), plus sinusoidal positions. It trains on the same
token batches with the same loss (token cross-entropy, padding ignored), AdamW(1e-4, weight
decay 1e-4) after clipping to global norm 1, in the same process, alternating with ours.
Unlike ours, `nn.Transformer` ends its post-LayerNorm encoder and decoder with one more
LayerNorm each. torch is never a dependency of this package: it is imported only here.
"""

import math

import numpy as np

from vit_jax import errors
from vit_jax.benchmark import timing, torch_device


def import_torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise errors.MissingPackageError(
        f'--compare torch needs torch ({error}); install it (pip install torch).') from error
  return torch


def _sinusoids(length: int, width: int) -> np.ndarray:
  """(length, width): sin on the first half of the features, cos on the second (as ours)."""
  positions = np.arange(length)[:, None]
  scales = np.exp(-math.log(10_000.0) * np.arange(width // 2) / (width // 2 - 1))
  angles = positions * scales[None]
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


class TorchSeq2SeqRunner(timing.Runner):
  """One training step of the torch peer per step, on the device JAX runs on; `bfloat16`
  runs it under autocast, as ours computes in bfloat16 with float32 parameters."""

  def __init__(self, fields: dict, vocab_size: int, inputs: np.ndarray, targets: np.ndarray,
               dtype: str):
    torch = import_torch()
    self.torch = torch
    self.device = torch_device.matching_device(torch, '--compare torch')
    self.dtype = dtype
    torch.manual_seed(0)
    width = fields['embed_dim']
    self.width = width
    self.embedding = torch.nn.Embedding(vocab_size, width)
    torch.nn.init.normal_(self.embedding.weight, std=width ** -0.5)
    self.transformer = torch.nn.Transformer(
        d_model=width, nhead=fields['num_heads'], num_encoder_layers=fields['num_layers'],
        num_decoder_layers=fields['num_layers'], dim_feedforward=fields['mlp_dim'],
        dropout=fields['dropout_rate'], activation=fields['activation'], batch_first=True,
        norm_first=fields['norm_position'] == 'pre')
    self.embedding.to(self.device)
    self.transformer.to(self.device)
    on_device = lambda array: torch.from_numpy(array).to(self.device)  # noqa: E731
    self.inputs = on_device(inputs.astype(np.int64))
    self.targets = on_device(targets.astype(np.int64))
    shifted = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # Start token 0, as ours.
    self.shifted = on_device(shifted.astype(np.int64))
    length = max(inputs.shape[1], targets.shape[1])
    self.positions = on_device(_sinusoids(length, width))
    steps = targets.shape[1]  # True above the diagonal: a query does not see later keys.
    self.causal = on_device(np.triu(np.ones((steps, steps), bool), k=1))
    self.source_padding = self.inputs == 0  # The batch is fixed: its masks are made once.
    self.target_padding = self.shifted == 0
    self.target_padding[:, 0] = False  # The start token 0 is not padding.
    self.parameters = list(self.embedding.parameters()) + list(self.transformer.parameters())
    self.optimizer = torch.optim.AdamW(self.parameters, lr=1e-4, weight_decay=1e-4)
    self.transformer.train()
    self.threads = torch.get_num_threads() if self.device.type == 'cpu' else None

  def _embed(self, tokens):
    x = self.embedding(tokens) * math.sqrt(self.width)
    return x + self.positions[:tokens.shape[1]]

  def start(self):
    torch = self.torch
    with torch_device.autocast(torch, self.device, self.dtype):
      out = self.transformer(self._embed(self.inputs), self._embed(self.shifted),
                             tgt_mask=self.causal, tgt_is_causal=True,
                             src_key_padding_mask=self.source_padding,
                             memory_key_padding_mask=self.source_padding,
                             tgt_key_padding_mask=self.target_padding)
      logits = out @ self.embedding.weight.T  # (B, T, V): the tied output projection.
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             self.targets.reshape(-1), ignore_index=0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
    self.optimizer.step()
    self.optimizer.zero_grad(set_to_none=True)
    return torch_device.queued_work_waiter(torch, self.device)
