"""Memory figures: the process's peak RSS, the device's peak, XLA's buffer sizes.

On GPU/TPU the device's `peak_bytes_in_use` (and torch's `max_memory_allocated`, in
`timm_runner`); on CPU the process's peak RSS (`resource.getrusage`), which covers
everything the process did so far, plus XLA's memory analysis of the compiled function.
"""

import jax

from vit_jax import runtime


def peak_rss_bytes() -> int:
  """This process's peak resident set size so far."""
  return runtime.peak_resident_bytes()


def device_peak_bytes() -> int | None:
  """Peak bytes in use on the first device (GPU/TPU), or None where not reported."""
  stats = jax.devices()[0].memory_stats() if jax.devices() else None
  return int(stats['peak_bytes_in_use']) if stats and 'peak_bytes_in_use' in stats else None


def memory_analysis(compiled) -> dict | None:
  """XLA's buffer sizes of a compiled function (bytes), or None if unavailable."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except  # Not every backend implements it.
    return None
  if analysis is None:
    return None
  fields = ('temp_size_in_bytes', 'argument_size_in_bytes', 'output_size_in_bytes',
            'alias_size_in_bytes', 'generated_code_size_in_bytes')
  result = {f: int(getattr(analysis, f, 0) or 0) for f in fields}
  result['total_bytes'] = (result['temp_size_in_bytes'] + result['argument_size_in_bytes']
                           + result['output_size_in_bytes'] - result['alias_size_in_bytes'])
  return result
