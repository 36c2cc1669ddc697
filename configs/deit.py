"""Train a DeiT from scratch, optionally distilled from a teacher ('hard' or 'soft').

python -m vit_jax.main --config=configs/deit.py:DeiT-S_16,cifar10 --workdir=runs/deit \
    --config.teacher=runs/teacher --config.distillation=hard
The argument is MODEL,DATASET. Defaults follow the DeiT recipe: AdamW, cosine decay,
label smoothing, drop-path, RandAugment, random erasing (a quarter of the images), mixup and
CutMix (half the batches each), repeated augmentation (each image three times in a row,
augmented apart), inputs
normalized with ImageNet's pixel mean and std, as Facebook's DeiT weights expect, DeiT's
train crop (resized bicubic and antialiased, as PIL does) and its eval crop (the shorter side
resized to 256, bicubic, the central 224); the distillation
token's share of the loss is 0.5 (config.distillation_weight).
"""

from vit_jax.data import normalization
from vit_jax.train.config import classification_config, model_and_dataset


def get_config(arg: str = 'DeiT-S_16,cifar10'):
  model, dataset = model_and_dataset(arg, 'configs/deit.py')
  config = classification_config(model)
  config.model.droppath_rate = 0.1
  config.data.dataset = dataset
  config.data.image_size = 224
  config.data.train_crop = 'inception_crop'
  config.data.train_interpolation = 'bicubic'
  config.data.eval_resize_ratio = 256 / 224  # DeiT's eval: resize to 256, the central 224,
  config.data.eval_resize = 'shorter_side'  # keeping the aspect ratio,
  config.data.eval_interpolation = 'bicubic'  # bicubic.
  config.data.flip = True
  config.data.randaugment_layers = 2
  config.data.randaugment_magnitude = 9.0
  config.data.mixup_alpha = 0.8
  config.data.cutmix_alpha = 1.0
  config.data.random_erasing_prob = 0.25
  config.data.repeated_augmentation = 3
  config.data.pixel_mean = normalization.IMAGENET_MEAN
  config.data.pixel_std = normalization.IMAGENET_STD
  config.batch_size = 1024
  config.eval_batch_size = 1024
  config.total_steps = 100_000
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 1e-3  # 5e-4 per 512 images, as in DeiT.
  config.optimizer.weight_decay = 0.05
  config.optimizer.warmup_steps = 5_000
  config.optimizer.grad_clip_norm = 0.0
  config.label_smoothing = 0.1
  config.eval_every = 5000
  config.checkpoint_every = 5000
  return config
