"""The trainer's config: every knob with its default. configs/*.py start from here."""

import ml_collections

from vit_jax.data import images, text
from vit_jax.models import registry
from vit_jax.train import optim


def model_config(name: str) -> ml_collections.ConfigDict:
  """The registry entry `name` as a ConfigDict; fields override the registry's settings."""
  config = ml_collections.ConfigDict(registry.model_config(name))
  config.name = name  # Registry entry; see `vit_jax.models.model_names()`.
  # Attention kernel: 'auto' (the fastest here), 'fused', 'plain', 'chunked' or 'blas'.
  config.attention_impl = 'auto'
  config.matmul = 'auto'  # Dense layers: 'auto' (MKL on Intel CPUs), 'xla' or 'blas'.
  return config


def visualize_config() -> ml_collections.ConfigDict:
  """Knobs of `trainer=visualize`, which writes attention-map and training-curve PNGs."""
  config = ml_collections.ConfigDict()
  # Image files (classification) or sentences (translation), separated by '|';
  # '': the first `num_examples` test examples.
  config.inputs = ''
  config.num_examples = 4  # Test examples drawn when `inputs` is empty.
  config.layer = -1  # Layer whose attention is drawn (negative: counted from the last).
  config.output_dir = ''  # Where the PNGs go; '': WORKDIR/visualize.
  return config


def classification_config(model: str = 'ViT-B_16') -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.task = 'classification'  # What is trained: 'classification' (images).
  # What runs: 'train', 'evaluate' (the latest checkpoint) or 'visualize' (attention PNGs).
  config.trainer = 'train'
  config.seed = 0  # Parameter init, dropout and data order.
  config.model = model_config(model)  # Registry name + overrides (dtype, dropout, ...).
  config.data = images.default_config()  # Dataset, preprocessing, augmentation.
  config.batch_size = 512  # Global training batch (all devices, all hosts).
  config.eval_batch_size = 512  # Global eval batch; the last partial batch is masked.
  config.total_steps = 10_000  # Optimizer updates.
  config.accum_steps = 1  # Split each batch into this many microbatches (less memory).
  config.optimizer = optim.default_config()  # Optimizer and learning-rate schedule.
  config.label_smoothing = 0.0  # Label smoothing of the cross-entropy targets.
  config.mixed_precision = False  # bfloat16 compute with float32 parameters.
  # Devices on the mesh axes (data, fsdp, model); one -1 takes the remaining devices.
  # The batch is split over data x fsdp; params FSDP-split over fsdp, tensor-parallel over model.
  config.mesh_shape = (-1, 1, 1)
  config.fsdp_min_size = 4096  # Params with fewer elements are never FSDP-split.
  # CPU runs (ignored on accelerators), applied by `python -m vit_jax.main` at start-up:
  # glibc keeps freed memory for reuse in one arena, so XLA's per-step temporary buffers
  # stop page-faulting (ViT-S/16 train step 1.87 s, not 2.39 s); the process does not
  # give that memory back to the system.
  config.tune_malloc = True
  config.pretrained = ''  # Weights to start from: a published .npz or a vit_jax workdir.
  config.reinit_head = False  # Re-initialise the head even when the class count matches.
  config.teacher = ''  # DeiT: a teacher's vit_jax workdir or .npz (hard distillation).
  config.teacher_model = ''  # DeiT: the teacher's model name when `teacher` is a .npz.
  config.log_every = 50  # Steps between progress lines (and NaN checks).
  config.eval_every = 1000  # Steps between evaluations (0: only at the end).
  config.checkpoint_every = 1000  # Steps between checkpoints (0: only at the end).
  config.keep_checkpoints = 2  # Checkpoints kept in WORKDIR/checkpoints.
  config.visualize = visualize_config()  # trainer=visualize: inputs, layer, output directory.
  return config


def translation_config(model: str = 'Transformer-base') -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.task = 'translation'  # What is trained: 'translation' (seq2seq text).
  # 'train', 'evaluate' (latest checkpoint), 'translate' (stdin) or 'visualize' (attention PNGs).
  config.trainer = 'train'
  config.seed = 0  # Parameter init, dropout and data order.
  config.model = model_config(model)  # Registry name + overrides (embed_dim, num_layers, ...).
  config.data = text.default_config()  # Corpus, tokenizer, lengths, packing.
  config.batch_size = 256  # Global training batch in (packed) rows.
  config.eval_batch_size = 256  # Global eval batch; the last partial batch is masked.
  config.total_steps = 100_000  # Optimizer updates.
  config.accum_steps = 1  # Split each batch into this many microbatches (less memory).
  config.optimizer = optim.default_config()  # Optimizer and learning-rate schedule.
  config.optimizer.name = 'adam'
  config.optimizer.b2 = 0.98  # The paper's Adam(0.9, 0.98, 1e-9).
  config.optimizer.eps = 1e-9
  config.optimizer.schedule = 'rsqrt'  # lr = peak * min(step / warmup, sqrt(warmup / step)).
  config.optimizer.warmup_steps = 4000
  config.optimizer.learning_rate = 512**-0.5 * 4000**-0.5  # d_model^-0.5 * warmup^-0.5 peak.
  config.label_smoothing = 0.1  # Label smoothing of the token cross-entropy.
  config.mixed_precision = False  # bfloat16 compute with float32 parameters.
  # Devices on the mesh axes (data, fsdp, model); one -1 takes the remaining devices.
  # The batch is split over data x fsdp; params FSDP-split over fsdp, tensor-parallel over model.
  config.mesh_shape = (-1, 1, 1)
  config.fsdp_min_size = 4096  # Params with fewer elements are never FSDP-split.
  # CPU runs (ignored on accelerators), applied by `python -m vit_jax.main` at start-up:
  # glibc keeps freed memory for reuse in one arena, so XLA's per-step temporary buffers
  # stop page-faulting (ViT-S/16 train step 1.87 s, not 2.39 s); the process does not
  # give that memory back to the system.
  config.tune_malloc = True
  config.beam_size = 4  # Beam width for evaluation and translation (1: greedy).
  config.length_penalty_alpha = 0.6  # GNMT length penalty ((5 + len) / 6)^alpha.
  config.max_decode_length = 0  # Longest output in tokens (0: data.max_length).
  config.decode_batch_size = 64  # Sentences decoded at once (per process).
  config.num_eval_decode = 0  # Test sentences decoded for BLEU / exact match (0: all).
  config.input_file = ''  # trainer=translate: read sentences from this file, not stdin.
  config.log_every = 100  # Steps between progress lines (and NaN checks).
  config.eval_every = 5000  # Steps between evaluations (0: only at the end).
  config.checkpoint_every = 5000  # Steps between checkpoints (0: only at the end).
  config.keep_checkpoints = 2  # Checkpoints kept in WORKDIR/checkpoints.
  config.visualize = visualize_config()  # trainer=visualize: inputs, layer, output directory.
  return config
