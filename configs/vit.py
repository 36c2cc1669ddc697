"""Fine-tune (or train) a ViT on a TFDS dataset or an image folder.

python -m vit_jax.main --config=configs/vit.py:ViT-B_16,cifar10 --workdir=runs/b16 \
    --config.pretrained=path/to/ViT-B_16.npz
python -m vit_jax.main --config=configs/vit.py:ViT-S_16,data/my_images --workdir=runs/mine
The argument is MODEL,DATASET: a registry name and a TFDS name, an image folder
DIR/{train,test}/<class>/*.{jpg,png}, or 'synthetic' (random batches of ImageNet's shape, made
without TensorFlow, for timing the trainer; its test split has ImageNet's 50,000 images, which
the final evaluation reads: for a short run on a CPU set --config.data.synthetic_test_examples).
Defaults follow the ViT paper's fine-tuning recipe (SGD with momentum, cosine decay).
"""

import os

from vit_jax.train.config import classification_config, model_and_dataset


def get_config(arg: str = 'ViT-B_16,cifar10'):
  model, dataset = model_and_dataset(arg, 'configs/vit.py')
  config = classification_config(model)
  config.data.dataset = dataset
  tfds = dataset != 'synthetic' and not os.path.isdir(os.path.expanduser(dataset))
  if tfds:  # Hold out 2% of the train split for model selection.
    config.data.train_split = 'train[:98%]'
  config.data.image_size = 224  # 384 matches the paper's fine-tuning resolution.
  config.data.train_crop = 'inception_crop'
  config.data.flip = True
  config.data.eval_resize_ratio = 1.0
  config.batch_size = 512
  config.eval_batch_size = 512
  config.total_steps = 10_000
  config.optimizer.name = 'sgd'
  config.optimizer.learning_rate = 0.03
  config.optimizer.momentum = 0.9
  config.optimizer.warmup_steps = 500
  config.optimizer.schedule = 'cosine'
  config.optimizer.grad_clip_norm = 1.0
  config.eval_every = 1000
  config.checkpoint_every = 1000
  return config
