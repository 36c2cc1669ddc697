"""Out of device memory: the one line names each knob that takes less memory in that mode."""

import jax

from vit_jax.train import config as config_lib, out_of_memory

XLA_OOM = jax.errors.JaxRuntimeError(
    'RESOURCE_EXHAUSTED: Out of memory allocating 8589934592 bytes.\nmore detail')


def test_only_xlas_resource_exhausted_is_out_of_memory():
  assert out_of_memory.is_out_of_memory(XLA_OOM)
  assert not out_of_memory.is_out_of_memory(jax.errors.JaxRuntimeError('INTERNAL: other'))
  assert not out_of_memory.is_out_of_memory(MemoryError('RESOURCE_EXHAUSTED'))


def test_training_names_the_batch_knobs_of_its_model_and_says_it_resumes():
  config = config_lib.classification_config('ViT-testing')
  assert out_of_memory.message(config, XLA_OOM) == (
      'Out of memory in trainer=train (XLA: Out of memory allocating 8589934592 bytes): lower '
      '--config.batch_size (now 512), or raise --config.accum_steps (now 1), or set '
      '--config.model.remat=True (now False), or lower --config.eval_batch_size (now 512); the '
      'checkpoints written so far are kept, and a rerun resumes from the latest.')
  config.model.remat = True
  assert 'remat' not in out_of_memory.message(config, XLA_OOM)  # Already on.
  translation = config_lib.translation_config('Transformer-testing')  # Its model has no remat.
  assert 'remat' not in out_of_memory.message(translation, XLA_OOM)
  assert '--config.beam_size (now 4)' in out_of_memory.message(translation, XLA_OOM)


def test_prediction_names_its_batch_and_nothing_about_resuming():
  config = config_lib.classification_config('ViT-testing')
  config.trainer = 'predict'
  assert out_of_memory.message(config, XLA_OOM) == (
      'Out of memory in trainer=predict (XLA: Out of memory allocating 8589934592 bytes): lower '
      '--config.predict.batch_size (now 32).')
