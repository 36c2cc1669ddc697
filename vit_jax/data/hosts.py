"""Which process this is: the default and the check both pipelines' `build` share."""


def resolve_host(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  """(process_index, process_count), defaulting to JAX's; checks the index is in range."""
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(
        f'process_index={process_index} must be in [0, process_count={process_count}).')
  return process_index, process_count
