"""The device a torch peer runs on (the one JAX runs on), its autocast, waiting for its steps."""

from typing import Any, Callable

import jax

from vit_jax import errors
from vit_jax.benchmark import timing


def matching_device(torch, flag: str):
  """torch's device for JAX's backend: a CUDA GPU, or the CPU with the cores XLA uses."""
  platform = jax.devices()[0].platform
  if platform == 'gpu' and torch.cuda.is_available():
    return torch.device('cuda')
  if platform == 'cpu':
    torch.set_num_threads(timing.device_info()['cpu_cores'])
    return torch.device('cpu')
  raise errors.ConfigError(f'No torch device matches the JAX {platform} backend (torch '
                           f'{torch.__version__}); {flag} runs on CPUs and CUDA GPUs.')


def autocast(torch, device, dtype: str):
  """A fresh context that runs torch in bfloat16 where ours computes in it (`dtype`
  'bfloat16', float32 parameters), under torch's autocast; a no-op context otherwise."""
  return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == 'bfloat16')


def queued_work_waiter(torch, device) -> Callable[[], Any]:
  """A function that waits for the work queued on `device` so far (on CPUs torch has
  finished it before returning)."""
  if device.type != 'cuda':
    return lambda: None
  event = torch.cuda.Event()
  event.record()
  return event.synchronize
