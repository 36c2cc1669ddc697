"""Few-shot linear probes on the model's pre-logits features, as big_vision reports them.

At each evaluation, the features of the train and the test split (eval preprocessing, no
augmentation) are computed on every process's share and gathered to every process. Then for each
shot count k, on the host in float64:
  1. k train examples of every class are picked (seeded; the picks for k contain those for any
     smaller count);
  2. features are standardised by the picked examples' mean and std (+ 1e-6);
  3. targets are 2 * one_hot(label) - 1, and the closed-form ridge regression
     w = solve(X^T X + l2_reg I, X^T Y) gives a linear probe (no bias: with k examples of every
     class, the best bias is the same for every class and leaves the argmax as it is);
  4. the figure is the accuracy of argmax(X_test w) on the test split.
"""

import dataclasses
import functools
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import errors
from vit_jax.data import checks, images
from vit_jax.evaluation import common
from vit_jax.train import mesh as mesh_lib

STD_EPS = 1e-6  # Added to each feature's std, so that constant features stay finite.


def fewshot_config() -> ml_collections.ConfigDict:
  """The few-shot probes' settings; the run's data config gives image size, channels, TFDS dirs."""
  config = ml_collections.ConfigDict()
  # What images.build reads: 'digits', a TFDS name ('cifar100', ...) or an image folder DIR.
  config.dataset = 'digits'
  config.train_split = 'train'  # Split the shots are picked from (all of it is read each time).
  config.test_split = 'test'  # Split the probes are scored on.
  config.shots = (1, 5, 10, 25)  # Examples per class of each probe; one figure per count.
  config.l2_reg = 2.0**10  # Ridge penalty on the probe weights (features are standardised).
  config.seed = 0  # Picks the shots; the same seed picks the same examples at every evaluation.
  return config


def checked_config(config) -> ml_collections.ConfigDict:
  """fewshot_config() updated with `config` (None: the defaults); bad values raise ConfigError."""
  check = checks.Checks(fewshot_config(), config or {}, 'fewshot config')
  c = check.config
  shots = tuple(c.shots) if isinstance(c.shots, (tuple, list)) else ()
  check.require(bool(shots) and all(checks.is_int(k) and k > 0 for k in shots)
                and len(set(shots)) == len(shots), 'shots', 'distinct ints > 0, e.g. (1, 5, 10)')
  check.require(isinstance(c.l2_reg, (int, float)) and c.l2_reg > 0, 'l2_reg', 'a number > 0')
  check.require_int('seed', 0)
  return check.result()


def short_name(dataset: str) -> str:
  """The dataset as a metric name part: an image folder's base name; letters, digits and '_'."""
  if os.path.isdir(os.path.expanduser(dataset)):
    dataset = os.path.basename(os.path.normpath(os.path.expanduser(dataset)))
  return re.sub(r'[^0-9a-z]+', '_', dataset.lower()).strip('_') or 'dataset'


def pick_shots(labels: np.ndarray, shots: int, num_classes: int, seed: int,
               where: str = 'the train split') -> np.ndarray:
  """Indices of `shots` examples of each class (class by class), the same for the same seed.

  Each class's examples are taken in a seeded random order, so a larger `shots` keeps the picks
  of a smaller one.

  Raises:
    ConfigError: a class has fewer than `shots` examples.
  """
  counts = np.bincount(labels, minlength=num_classes)
  short = np.flatnonzero(counts < shots)
  if short.size:
    raise errors.ConfigError(
        f'Few-shot probe with shots={shots}: class {short[0]} has {counts[short[0]]} examples in '
        f'{where}, {short.size} class(es) have fewer than {shots}; use shots of at most '
        f'{counts.min()} or a train split with more examples of every class.')
  rng = np.random.default_rng(seed)
  return np.concatenate([rng.permutation(np.flatnonzero(labels == label))[:shots]
                         for label in range(num_classes)])


@dataclasses.dataclass(frozen=True)
class Probe:
  """A linear probe on standardised features: scores = ((x - mean) / std) @ weights."""
  mean: np.ndarray  # (D,)
  std: np.ndarray  # (D,), eps included.
  weights: np.ndarray  # (D, num_classes)

  def standardise(self, features: np.ndarray) -> np.ndarray:
    return (np.asarray(features, np.float64) - self.mean) / self.std

  def predict(self, features: np.ndarray) -> np.ndarray:
    return np.argmax(self.standardise(features) @ self.weights, axis=-1)


def fit_probe(features: np.ndarray, labels: np.ndarray, num_classes: int,
              l2_reg: float) -> Probe:
  """Closed-form ridge regression of 2 * one_hot(labels) - 1 on the standardised features."""
  features = np.asarray(features, np.float64)
  mean = features.mean(axis=0)
  std = features.std(axis=0) + STD_EPS
  x = (features - mean) / std
  targets = 2.0 * np.eye(num_classes)[labels] - 1.0
  weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(x.shape[1]), x.T @ targets)
  return Probe(mean, std, weights)


@functools.lru_cache(maxsize=8)
def _gather_fn(mesh):
  """Jitted: a global batch's features and labels, replicated on every device of every process."""
  def gather(features, labels, mask, process, position):
    return features.astype(jnp.float32), labels, mask, process, position
  return jax.jit(gather, out_shardings=mesh_lib.replicated(mesh))


class FewShotEvaluator(common.Evaluator):
  """Few-shot probe accuracy for each shot count (see the module docstring)."""

  name = 'fewshot'

  def __init__(self, config: ml_collections.ConfigDict, data_config: ml_collections.ConfigDict,
               process_index: int, process_count: int):
    self.config = checked_config(config)
    self._process_index = process_index
    self.splits = {key: self._open(data_config, self.config[key], process_index, process_count)
                   for key in ('train_split', 'test_split')}
    self.num_classes = self.splits['train_split'].num_classes
    dataset = short_name(self.config.dataset)
    self.metric_names = tuple(f'fewshot_{dataset}_{k}shot' for k in self.config.shots)

  def __repr__(self):
    return f'FewShotEvaluator({self.config.dataset!r}, shots={tuple(self.config.shots)})'

  def _open(self, data_config, split: str, process_index: int, process_count: int):
    """The dataset with `split` as its test split (labels follow the train split's classes)."""
    config = ml_collections.ConfigDict(data_config).copy_and_resolve_references()
    config.dataset = self.config.dataset
    config.train_split = self.config.train_split
    config.test_split = split
    config.shuffle_buffer = 0  # The train stream is never read here.
    try:
      return images.build(config, process_index=process_index, process_count=process_count)
    except errors.ConfigError as e:
      raise errors.ConfigError(f'Few-shot evaluation (fewshot config dataset='
                               f'{self.config.dataset!r}, split={split!r}): {e}') from None

  def features(self, key: str, features_fn, mesh, batch_size: int, in_flight: int | None = None):
    """(float64 (N, D) features, int (N,) labels) of a whole split, on every process; at most
    `in_flight` batches queued on the devices at once (None: two).

    Each example carries (process, position in that process's share); sorted by these, the
    gathered examples come in the order one process alone reads the split, for any number of
    processes and devices (shares are consecutive runs of that order).
    """
    dataset = self.splits[key]
    process_index = self._process_index

    def numbered(batches):
      position = 0
      for local in batches:
        size = len(local['mask'])
        yield {**local, 'process': np.full(size, process_index, np.int32),
               'position': np.arange(position, position + size, dtype=np.int32)}
        position += size

    gather = _gather_fn(mesh)
    batches = common.global_batches(numbered(dataset.eval_batches(batch_size)),
                                    dataset.num_eval_batches(batch_size), mesh,
                                    f'Few-shot features of {self.config[key]!r} of {dataset.name}')
    fetched, queued = [], []
    for batch in batches:
      if len(queued) >= (in_flight or 2):  # Fetched late, so that the devices keep working.
        fetched.append(jax.device_get(queued.pop(0)))
      queued.append(gather(features_fn(batch['image']), batch['label'], batch['mask'],
                           batch['process'], batch['position']))
    fetched.extend(jax.device_get(queued))
    features, labels, mask, process, position = (np.concatenate(parts) for parts in zip(*fetched))
    keep = mask > 0
    order = np.lexsort((position[keep], process[keep]))
    return features[keep][order].astype(np.float64), labels[keep][order]

  def evaluate(self, logits_fn, features_fn, mesh, batch_size, in_flight=None):
    del logits_fn
    c = self.config
    train_features, train_labels = self.features('train_split', features_fn, mesh, batch_size,
                                                 in_flight)
    where = f'split {c.train_split!r} of {c.dataset!r}'
    picks = {k: pick_shots(train_labels, k, self.num_classes, c.seed, where) for k in c.shots}
    test_features, test_labels = self.features('test_split', features_fn, mesh, batch_size,
                                               in_flight)
    results = {}
    for name, shots in zip(self.metric_names, c.shots):
      probe = fit_probe(train_features[picks[shots]], train_labels[picks[shots]], self.num_classes,
                        c.l2_reg)
      results[name] = float(np.mean(probe.predict(test_features) == test_labels))
    return results
