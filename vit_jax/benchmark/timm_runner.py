"""`--compare timm`: the matching timm model, with our weights, stepping like ours.

The timm model is loaded with the same weights through `vit_jax.weights.to_timm` and
runs in the same process on the same inputs; the benchmark alternates it with ours in
rounds, so that background load hits both alike. torch and timm are never dependencies
of this package: they are imported only here, and only with --compare timm.
"""

import sys

import jax
import numpy as np

from vit_jax import errors, models
from vit_jax.benchmark import steps, timing, torch_device

# Our registry name -> timm model name (created with pretrained=False).
TIMM_NAMES = {
    'ViT-Ti_16': 'vit_tiny_patch16_224', 'ViT-S_16': 'vit_small_patch16_224',
    'ViT-S_32': 'vit_small_patch32_224', 'ViT-B_16': 'vit_base_patch16_224',
    'ViT-B_32': 'vit_base_patch32_224', 'ViT-L_16': 'vit_large_patch16_224',
    'ViT-L_32': 'vit_large_patch32_224', 'ViT-H_14': 'vit_huge_patch14_224',
    'R50+ViT-B_16': 'vit_base_r50_s16_224', 'R26+ViT-S_32': 'vit_small_r26_s32_224',
    'R+ViT-Ti_16': 'vit_tiny_r_s16_p8_224', 'DeiT-Ti_16': 'deit_tiny_distilled_patch16_224',
    'DeiT-S_16': 'deit_small_distilled_patch16_224',
    'DeiT-B_16': 'deit_base_distilled_patch16_224',
}


def import_timm(extra_path: str | None):
  """(torch, timm), or raises ImportError with what to do."""
  if extra_path:
    sys.path.append(extra_path)
  try:
    import timm  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise errors.MissingPackageError(
        f'--compare timm needs torch and timm ({error}). Install them (pip install torch '
        'timm), or point --timm-path at a site-packages directory that has them.') from error
  return torch, timm


class TimmRunner(timing.Runner):
  """The timm model with our weights, stepping like ours (eval forward or AdamW step)."""

  def __init__(self, args, params, images: np.ndarray, labels: np.ndarray):
    from vit_jax import weights  # pylint: disable=g-import-not-at-top
    torch, timm = import_timm(args.timm_path)
    self.torch = torch
    self.device = torch_device.matching_device(torch, '--compare timm')
    if args.model not in TIMM_NAMES:
      raise errors.ConfigError(f'No timm counterpart of {args.model}; --compare timm knows '
                               f'{", ".join(TIMM_NAMES)}.')
    config = models.model_config(args.model)
    depth = {'depth': args.num_layers} if args.num_layers else {}  # --num-layers, as ours.
    self.model = timm.create_model(
        TIMM_NAMES[args.model], pretrained=False, num_classes=steps.NUM_CLASSES,
        img_size=args.resolution, drop_path_rate=config.get('droppath_rate', 0.0), **depth)
    state_dict = weights.to_timm(jax.device_get(params))
    missing, unexpected = self.model.load_state_dict(
        {k: torch.tensor(np.array(v)) for k, v in state_dict.items()}, strict=False)
    if missing or unexpected:
      raise errors.ConfigError(f'timm {TIMM_NAMES[args.model]} does not take our weights: missing '
                               f'{missing[:5]}, unexpected {unexpected[:5]}.')
    self.model.to(self.device)
    self.images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).to(
        self.device)
    self.labels = torch.from_numpy(labels.astype(np.int64)).to(self.device)
    self.dtype = args.dtype
    self.mode = args.mode
    self.threads = torch.get_num_threads() if self.device.type == 'cpu' else None
    if self.mode == 'train':
      self.model.train()
      # As ours: AdamW(1e-4, 0.9, 0.999, 1e-8, wd 1e-4) after clipping to global norm 1
      # (torch decays every parameter, ours the kernels only).
      self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4,
                                         weight_decay=1e-4)
    else:
      self.model.eval()

  def logits(self) -> np.ndarray:
    """Eval-mode float32 logits on the benchmark images (for the same-weights check)."""
    torch = self.torch
    training = self.model.training
    self.model.eval()
    with torch.inference_mode():
      logits = self.model(self.images).float().cpu().numpy()
    self.model.train(training)
    return logits

  def start(self):
    torch = self.torch
    if self.mode == 'infer':
      with torch.inference_mode(), torch_device.autocast(torch, self.device, self.dtype):
        self.model(self.images)
    else:
      with torch_device.autocast(torch, self.device, self.dtype):
        logits = self.model(self.images)
      loss = torch.nn.functional.cross_entropy(logits.float(), self.labels)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.optimizer.step()
      self.optimizer.zero_grad(set_to_none=True)
    return torch_device.queued_work_waiter(torch, self.device)

  def reset_peak_memory(self):
    if self.device.type == 'cuda':
      self.torch.cuda.reset_peak_memory_stats()

  def peak_memory(self) -> int | None:
    if self.device.type == 'cuda':
      return int(self.torch.cuda.max_memory_allocated())
    return None
