"""How each documented command runs in tests/test_docs.py: the overrides that shrink it and
what its output must hold (`RULES`, first match wins), and the environment of a command that
needs the network (`OFFLINE`)."""

import dataclasses
import importlib.util

from vit_jax.benchmark import gpu_target

# Commands that need the network run offline anywhere: downloads go to a closed port, and
# TensorFlow's gs:// client gives up at the first failure instead of retrying for minutes, and
# does not first wait (about 10 s) for a Compute Engine metadata server to give credentials.
OFFLINE = {'HTTP_PROXY': 'http://127.0.0.1:9', 'HTTPS_PROXY': 'http://127.0.0.1:9',
           'http_proxy': 'http://127.0.0.1:9', 'https_proxy': 'http://127.0.0.1:9',
           'NO_PROXY': 'localhost,127.0.0.1', 'no_proxy': 'localhost,127.0.0.1',
           'GCS_RETRY_CONFIG_MAX_RETRIES': '0', 'NO_GCE_CHECK': 'true'}

TINY_DIGITS = ('--config.total_steps=4 --config.log_every=2 --config.eval_every=0 '
               '--config.checkpoint_every=0')
NARROW = ('--config.model.hidden_size=32 --config.model.mlp_dim=64 --config.model.num_heads=2 '
          '--config.model.num_layers=1 --config.data.image_size=32 --config.batch_size=8 '
          '--config.eval_batch_size=8')
TINY_IMAGES = f'{NARROW} {TINY_DIGITS}'
TINY_DATES = ('--config.total_steps=4 --config.data.dates_train_size=256 '
              '--config.data.dates_test_size=16 --config.eval_every=0 --config.checkpoint_every=0 '
              '--config.log_every=2 --config.decode_batch_size=16')
TINY_TEXT = ('--config.total_steps=4 --config.data.vocab_size=40 --config.model.embed_dim=32 '
             '--config.model.mlp_dim=64 --config.model.num_heads=2 --config.model.num_layers=1 '
             '--config.batch_size=16 --config.eval_batch_size=16 --config.num_eval_decode=8 '
             '--config.beam_size=2 --config.decode_batch_size=8 --config.data.max_length=32 '
             '--config.log_every=2 --config.eval_every=0 --config.checkpoint_every=0')
TINY_BENCH = '--batch 1 --resolution 32 --steps 1 --warmup 0 --rounds 1'
NO_DOWNLOAD = '--config.data.tfds_download_retries=0'
# `--compare timm` runs where torch and timm are installed, else says it needs them.
HAS_TIMM = all(importlib.util.find_spec(name) for name in ('torch', 'timm'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
# `--compile-for` compiles where JAX's CUDA plugin is installed, else says it needs it.
HAS_CUDA_PLUGIN = gpu_target.cuda_plugin_installed()
TINY_SEQ2SEQ = ('--num-layers 1 --embed-dim 16 --num-heads 2 --mlp-dim 24 --seq-len 8 '
                '--decode-length 8 --vocab-size 64 --batch 2 --steps 1 --warmup 0 --rounds 1')


@dataclasses.dataclass(frozen=True)
class Rule:
  """How to run the documented commands that `pattern` matches (searched in the command)."""
  pattern: str
  append: str = ''  # Shrinking overrides, after each `python -m vit_jax...` of the command.
  expect: str = ''  # A regex the command's stdout and stderr must hold.
  error: str = ''  # The regex of its one-line error, for a command that needs the network.
  offline: bool = False  # Run it with downloads failing at once.


# First match wins; the last rule catches every other vit_jax.main command.
RULES = [
    Rule(r'vit_jax\.main .*--coordinator_address=10\.0\.0\.1', '--distributed_timeout=3',
         error=r'did not start within --distributed_timeout=3s: process 0 hosts the '
               r'coordinator at 10\.0\.0\.1:1234', offline=True),
    Rule(r'--coordinator_address=localhost', TINY_DIGITS, expect=r'eval at step 4: accuracy'),
    Rule(r'transformer_wmt\.py', NO_DOWNLOAD, offline=True,
         error=r"TFDS dataset 'wmt14_translate/de-en' is not prepared .* preparing it failed"),
    Rule(r'--config\.pretrained=gs://', TINY_IMAGES, offline=True,
         error=r'Cannot reach gs://vit_models/imagenet21k/\S+\.npz'),
    Rule(r'trainer=predict.*--config\.pretrained=', NARROW,
         expect=r'\.jpg\n +\d+\.\d\d%  \w'),
    Rule(r'trainer=predict', '', expect=r'\.png\n +\d+\.\d\d%  \d'),
    Rule(r'trainer=visualize', '', expect=r'Wrote \S+\.png'),
    Rule(r'trainer=translate', '--config.decode_batch_size=4', expect=r'\S'),
    Rule(r'trainer=evaluate', '', expect=r'eval of step 4:'),
    Rule(r'configs/transformer_dates\.py', TINY_DATES, expect=r'eval at step 4:.*exact_match'),
    Rule(r'configs/transformer_text\.py', TINY_TEXT, expect=r'eval at step 4:.*bleu'),
    Rule(r'configs/transformer_small\.py', TINY_TEXT, expect=r'eval at step 4:.*bleu'),
    Rule(r'vit_jax\.data\.make_corpus', '--train_pairs=300 --test_pairs=20',
         expect=r'Wrote 300 train and 20 test sentence pairs to \S+'),
    Rule(r'--config\.model\.dropout_rate=0\.1', TINY_IMAGES,
         expect=r'Model ViT-Ti_16 with .*dropout_rate=0\.1.*scan_layers=True, remat=True(.|\n)*'
                r'eval at step 4: accuracy'),
    Rule(r'configs/vit_small_images\.py', TINY_IMAGES, expect=r'eval at step 4: accuracy'),
    # DeiT-S at its own width (the converted published file), on 32x32 images; its 12 layers
    # scanned, which compiles one layer instead of twelve.
    Rule(r'--config\.pretrained=DeiT-S_16\.npz', f'{TINY_DIGITS} --config.data.image_size=32 '
         '--config.batch_size=8 --config.eval_batch_size=8 --config.model.scan_layers=True',
         expect=r'Distilling from teacher(.|\n)*eval at step 4: accuracy .*ema_accuracy .*'
                r'ema_distillation_head_accuracy'),
    Rule(r'configs/(vit|deit)\.py', TINY_IMAGES, expect=r'eval at step 4: accuracy'),
    Rule(r'configs/vit_digits\.py', TINY_DIGITS,
         expect=r'eval at step 4: accuracy|has finished: its latest checkpoint is at step 4'),
    Rule(r'vit_jax\.data\.make_image_folder', '--train_size=40 --test_size=20',
         expect=r'Wrote 40 train and 20 test images \(32x32, 10 classes\) to \S+'),
    Rule(r'vit_jax\.convert .*--print', '', expect=r'head/kernel +\(768, 1000\)'),
    Rule(r'vit_jax\.convert', '', expect=r'Wrote \S+'),
    Rule(r'vit_jax\.benchmark .*--compare timm', f'{TINY_BENCH} --num-layers 1',
         expect=r'ours/timm images/s') if HAS_TIMM else
    Rule(r'vit_jax\.benchmark .*--compare timm', TINY_BENCH,
         error=r'--compare timm needs torch and timm'),
    Rule(r'vit_jax\.benchmark .*--attention-memory', '--model ViT-testing --resolutions 32',
         expect=r'chunked'),
    Rule(r'vit_jax\.benchmark .*--compile-depth',
         '--depth-model ViT-testing --resolution 32 --compile-repeats 1 --no-unrolled',
         expect=r'deep/shallow compile time'),
    Rule(r'vit_jax\.benchmark .*--mode data', '--num-images 8 --batch 4 --steps 1 --warmup 1 '
         '--resolution 32 --variants crop+flip', expect=r'crop\+flip +\d'),
    Rule(r'vit_jax\.benchmark .*--mode seq2seq.*--profile', TINY_SEQ2SEQ, expect=r'of the step'),
    Rule(r'vit_jax\.benchmark .*--mode seq2seq.*--compare torch', TINY_SEQ2SEQ,
         expect=r'ours/torch train tokens/s') if HAS_TORCH else
    Rule(r'vit_jax\.benchmark .*--mode seq2seq.*--compare torch', TINY_SEQ2SEQ,
         error=r'--compare torch needs torch'),
    Rule(r'vit_jax\.benchmark .*--mode seq2seq',
         '--num-layers 1 --seq-len 8 --decode-length 8 --vocab-size 64 --batch 2 --steps 1 '
         '--warmup 0 --rounds 1', expect=r'tokens/s'),
    Rule(r'vit_jax\.benchmark .*--compile-for', f'{TINY_BENCH} --num-layers 1',
         expect=r'MFU cannot exceed') if HAS_CUDA_PLUGIN else
    Rule(r'vit_jax\.benchmark .*--compile-for', TINY_BENCH,
         error=r"--compile-for needs JAX's CUDA plugin"),
    # It reads what `--compile-for ... --hlo-out` wrote, which needs the plugin too.
    Rule(r'vit_jax\.benchmark\.hlo_costs', '', expect=r'MFU cannot exceed') if HAS_CUDA_PLUGIN
    else Rule(r'vit_jax\.benchmark\.hlo_costs', '', error=r'cannot read the kernels of'),
    Rule(r'vit_jax\.benchmark', f'{TINY_BENCH} --num-layers 1', expect=r'images/s'),
    Rule(r'vit_jax\.models ViT-B_16', '', expect=r'86,567,656 parameters'),
    Rule(r'vit_jax\.models$', '', expect=r'Transformer-base'),
]
