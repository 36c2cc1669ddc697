"""Refusing stored parameters written by a model of another shape, naming the first that differ."""

from vit_jax import errors, weights


def check_shapes(stored, expected, what: str,
                 advice: str = 'Use a new --workdir, or the config that wrote it.'):
  """Raises a ConfigError naming the first parameters whose shapes differ (trees of arrays or
  of their shapes); `what` names the stored ones."""
  flat_expected, flat_stored = weights.flatten_params(expected), weights.flatten_params(stored)
  shape = lambda flat, name: tuple(flat[name].shape) if name in flat else None  # noqa: E731
  mismatched = []
  for name in sorted(set(flat_expected) | set(flat_stored)):
    want_shape, have_shape = shape(flat_expected, name), shape(flat_stored, name)
    if want_shape != have_shape:
      mismatched.append(f'{name}: checkpoint {have_shape or "missing"}, '
                        f'model {want_shape or "missing"}')
  if mismatched:
    raise errors.ConfigError(
        f'{what} was written by a model of another shape ({len(mismatched)} mismatched '
        f'parameters, first: {"; ".join(mismatched[:3])}). {advice}')


# For the modes that read a workdir's weights with its config.
SAVED_CONFIG_ADVICE = ('Use the config that wrote it: leave out --config and overrides of '
                       "config.model or config.data (the workdir's config.json has them).")
