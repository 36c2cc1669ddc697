"""A device out of memory, said in one line with the knobs that take less of it.

XLA raises `JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory ...')` when a program's
buffers do not fit (a batch, a beam, a model too large for the device); that is the run's
settings, not a bug, so the modes end it as a `UserError` instead of a traceback.
"""

import jax
import ml_collections

from vit_jax.train import config as config_lib

# The fields that set what each mode of each task holds in memory at once: (field, 'lower',
# 'raise', or the value to set).
_TRAIN = (('batch_size', 'lower'), ('accum_steps', 'raise'), ('model.remat', 'True'))
_KNOBS = {
    ('classification', 'train'): (*_TRAIN, ('eval_batch_size', 'lower')),
    ('classification', 'evaluate'): (('eval_batch_size', 'lower'),),
    ('classification', 'predict'): (('predict.batch_size', 'lower'),),
    ('classification', 'visualize'): (('visualize.num_examples', 'lower'),),
    ('translation', 'train'): (*_TRAIN, ('eval_batch_size', 'lower'),
                               ('decode_batch_size', 'lower'), ('beam_size', 'lower')),
    ('translation', 'evaluate'): (('eval_batch_size', 'lower'), ('decode_batch_size', 'lower'),
                                  ('beam_size', 'lower')),
    ('translation', 'translate'): (('decode_batch_size', 'lower'), ('beam_size', 'lower')),
    ('translation', 'visualize'): (('visualize.num_examples', 'lower'),),
}


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's out-of-memory error (JaxRuntimeError, RESOURCE_EXHAUSTED)."""
  return isinstance(error, jax.errors.JaxRuntimeError) and 'RESOURCE_EXHAUSTED' in str(error)


def message(config: ml_collections.ConfigDict, error: BaseException) -> str:
  """'Out of memory in trainer=train (XLA: ...): lower --config.batch_size (now 512), ...'."""
  first_line = str(error).strip().splitlines()[0] if str(error).strip() else 'no message'
  xla_says = first_line.removeprefix('RESOURCE_EXHAUSTED: ').rstrip('.')
  knobs = []
  for name, how in _KNOBS.get((config.task, config.trainer), ()):
    present, value = config_lib.find_field(config, name)
    if present and str(value) != how:  # A setting already at the value to set is no advice.
      change = f'{how} --config.{name}' if how in ('lower', 'raise') else \
          f'set --config.{name}={how}'
      knobs.append(f'{change} (now {value!r})')
  advice = ', or '.join(knobs) if knobs else 'use a device with more memory'
  resumes = ('; the checkpoints written so far are kept, and a rerun resumes from the latest'
             if config.trainer == 'train' else '')
  return f'Out of memory in trainer={config.trainer} (XLA: {xla_says}): {advice}{resumes}.'
