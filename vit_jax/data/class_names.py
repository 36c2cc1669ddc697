"""The names of a classifier's classes, found without building its dataset.

Training saves them in WORKDIR/class_names.json. For a data config alone, `for_dataset`
finds them from what is at hand: digits' digits, the ImageNet-1k names this package
ships (imagenet2012 and the test sets that share its 1,000 classes), a TFDS dataset's
label names, or an image folder's class directories.
"""

import importlib.resources
import json

import ml_collections

from vit_jax import errors, files

FILE = 'class_names.json'
# TFDS datasets whose labels are ImageNet-1k's 1,000 classes in imagenet2012's order.
IMAGENET_1K_DATASETS = ('imagenet2012', 'imagenet2012_real', 'imagenet2012_subset',
                        'imagenet_v2', 'imagenet_sketch')


def save(workdir: str, names) -> None:
  """Writes WORKDIR/class_names.json (a JSON list), unless it holds these names already."""
  path = files.join(workdir, FILE)
  names = [str(name) for name in names]
  try:
    if load(workdir) == tuple(names):
      return
  except errors.BadFileError:
    pass  # Written anew.
  files.write_text_atomically(path, json.dumps(names, ensure_ascii=False, indent=0) + '\n')


def load(workdir: str) -> tuple[str, ...] | None:
  """The names saved in WORKDIR/class_names.json, or None."""
  path = files.join(workdir, FILE)
  if not files.exists(path):
    return None
  try:
    names = json.loads(files.read_text(path))
  except json.JSONDecodeError as e:
    raise errors.BadFileError(f'{path} is not valid JSON ({e}); delete it to show class '
                              'indices, or write the names as a JSON list.') from None
  if not isinstance(names, list):
    raise errors.BadFileError(f'{path} holds no list of class names; delete it to show class '
                              'indices, or write the names as a JSON list.')
  return tuple(str(name) for name in names)


def check_learnt(workdir: str | None, names, dataset: str, teacher: bool = False):
  """Raises when the run in `workdir` (the student's own, or its teacher) learnt other classes,
  or another order, than the data's `names`."""
  learnt = load(workdir) if workdir else None
  names = tuple(str(name) for name in names)
  if learnt is None or learnt == names:
    return
  shorter = min(len(names), len(learnt))
  label = next((i for i in range(shorter) if names[i] != learnt[i]), shorter)
  name_in = lambda classes: repr(classes[label]) if label < len(classes) else 'no class'
  run = 'the teacher' if teacher else 'the run'
  remedy = ('Use a teacher trained on these classes.' if teacher else
            'Use the data it was trained on, or a new --workdir to train on this data.')
  raise errors.ConfigError(
      f'config.data.dataset={dataset!r} ({len(names)} classes) does not label its classes as '
      f'{run} in {workdir} learnt them ({len(learnt)} classes, {FILE}): label '
      f'{label} is {name_in(names)} in the data, {name_in(learnt)} in {run}. {remedy}')


def imagenet2012() -> tuple[str, ...]:
  """The 1,000 ImageNet-1k class names (WordNet lemmas) in TFDS imagenet2012's label order."""
  text = (importlib.resources.files('vit_jax.data') / 'imagenet2012_classes.txt').read_text(
      encoding='utf-8')
  return tuple(line.split('\t', 1)[1] for line in text.splitlines() if line)


def for_dataset(config: ml_collections.ConfigDict) -> tuple[str, ...] | None:
  """Names for the data config's dataset without reading it; None when none are known."""
  name = config.dataset
  if name == 'digits':
    return tuple(str(digit) for digit in range(10))
  if name.split('/')[0].split(':')[0] in IMAGENET_1K_DATASETS:
    return imagenet2012()
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  folder = files.join(name, config.train_split)
  if files.isdir(folder):
    return tuple(sources.list_class_dirs(folder))
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    label = tfds.builder(name, data_dir=config.tfds_data_dir).info.features['label']
    return tuple(label.names)
  except Exception:  # pylint: disable=broad-except  # Not a TFDS name, no label names, ...
    return None
