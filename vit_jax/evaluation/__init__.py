"""Evaluations beyond the test split, run at each evaluation of a classification run.

  evaluators = evaluation.build(('imagenet2012_real', 'fewshot'), config.data,
                                evaluation.fewshot_config(), num_classes=1000)
  figures = evaluation.run(evaluators, logits_fn, features_fn, mesh, local_eval_batch)
  # {'imagenet2012_real_accuracy': ..., 'fewshot_digits_1shot': ..., ...}

`logits_fn(images)` -> float32 (B, 1000) and `features_fn(images)` -> (B, D) pre-logits features
are jitted callables on global device batches. Every figure is the same on every process.

  imagenet2012_real  ReaL accuracy on ImageNet's validation split      imagenet2012_real_accuracy
  imagenet_v2        top-1 accuracy on ImageNet-v2 (matched frequency)  imagenet_v2_accuracy
  imagenet_sketch    top-1 accuracy on ImageNet-Sketch                  imagenet_sketch_accuracy
  imagenet_a         top-1 accuracy over ImageNet-A's 200 classes       imagenet_a_accuracy
  imagenet_r         top-1 accuracy over ImageNet-R's 200 classes       imagenet_r_accuracy
  fewshot            k-shot ridge probes on the pre-logits features     fewshot_{dataset}_{k}shot

See `imagenet` and `fewshot` for how each is computed. Importing this package is cheap:
TensorFlow is imported when an evaluation's data is opened.
"""

import collections

import ml_collections

from vit_jax import errors
from vit_jax.data import checks, hosts, images
from vit_jax.evaluation import fewshot, imagenet
from vit_jax.evaluation.common import Evaluator, ImagesFn
from vit_jax.evaluation.fewshot import fewshot_config

EVALS = ('imagenet2012_real', 'imagenet_v2', 'imagenet_sketch', 'imagenet_a', 'imagenet_r',
         'fewshot')

__all__ = ['EVALS', 'Evaluator', 'build', 'fewshot_config', 'names_of', 'run']


def _check_names(names, num_classes: int):
  if isinstance(names, str) or not all(isinstance(name, str) for name in names):
    raise errors.ConfigError(f'Extra evaluations {names!r} must be a tuple of names, e.g. '
                             f"('imagenet2012_real', 'fewshot'); the known ones are {EVALS}.")
  for name in names:
    if name not in EVALS:
      raise errors.ConfigError(f'Unknown extra evaluation {name!r} in {tuple(names)}; the known '
                               f'ones are {EVALS}.')
  repeated = [name for name, count in collections.Counter(names).items() if count > 1]
  if repeated:
    raise errors.ConfigError(f'Extra evaluation {repeated[0]!r} is listed more than once in '
                             f'{tuple(names)}; list each evaluation once.')
  for name in names:
    if name in imagenet.VARIANTS and num_classes != imagenet.NUM_CLASSES:
      raise errors.ConfigError(
          f'Extra evaluation {name!r} scores the 1,000 ImageNet classes, but the model has '
          f'num_classes={num_classes}; drop it, or train on the 1,000 ImageNet classes '
          '(e.g. imagenet2012).')


def names_of(evals) -> tuple[str, ...]:
  """config.evals as names: `--config.evals=a,b` gives ('a,b',), which means ('a', 'b')."""
  if isinstance(evals, str):
    evals = (evals,)
  return tuple(name.strip() for entry in evals for name in str(entry).split(',') if name.strip())


def build(names: tuple[str, ...], data_config, fewshot_config, num_classes: int,
          process_index: int | None = None, process_count: int | None = None) -> list[Evaluator]:
  """The evaluators of `names` (see EVALS), in that order, with their data opened for this host.

  Args:
    names: which evaluations, each at most once.
    data_config: the run's data config (or dict): image_size, channels, the eval_* fields, the
      tfds_* fields, cache and prefetch apply to these datasets as to the test split.
    fewshot_config: settings of 'fewshot' (see fewshot_config; None: its defaults).
    num_classes: the model's classes; the ImageNet variants need 1000.
    process_index: this host's index; None: jax.process_index().
    process_count: number of hosts; None: jax.process_count().

  Raises:
    ConfigError: an unknown or repeated name, an ImageNet variant for a model without 1,000
      classes, or a bad fewshot config.
    DataUnavailableError: a TFDS dataset that is not prepared and cannot be prepared here.
  """
  _check_names(names, num_classes)
  process_index, process_count = hosts.resolve_host(process_index, process_count)
  data_config = checks.Checks(images.default_config(), ml_collections.ConfigDict(data_config),
                              'data config').result()
  evaluators = []
  for name in names:
    if name == 'fewshot':
      evaluators.append(fewshot.FewShotEvaluator(fewshot_config, data_config, process_index,
                                                 process_count))
    else:
      evaluators.append(imagenet.ImageNetEvaluator(imagenet.VARIANTS[name], data_config,
                                                   process_index, process_count))
  return evaluators


def run(evaluators: list[Evaluator], logits_fn: ImagesFn, features_fn: ImagesFn, mesh,
        batch_size: int, in_flight: int | None = None) -> dict[str, float]:
  """Runs each evaluator once: {metric name: value}, the same on every process.

  Args:
    evaluators: what `build` returned.
    logits_fn: images (a global batch) -> float32 (B, 1000) logits; jitted.
    features_fn: images -> (B, D) pre-logits features; jitted.
    mesh: the run's mesh; batches are split over its data x fsdp axes.
    batch_size: this process's eval batch (config.eval_batch_size // process_count).
    in_flight: at most this many batches queued on the devices at once; None: each
      evaluator's own limit (few-shot fetches one batch late; the ImageNet variants have none).
  """
  figures = {}
  for evaluator in evaluators:
    figures.update(evaluator.evaluate(logits_fn, features_fn, mesh, batch_size, in_flight))
  return figures
