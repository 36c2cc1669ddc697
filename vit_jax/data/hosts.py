"""Which process this is, and its share of a split: what both pipelines' `build` share."""


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


def host_range(num_examples: int, process_index: int, process_count: int) -> tuple[int, int]:
  """[start, stop) of this host's share; the first num_examples % process_count get one more."""
  base, extra = divmod(num_examples, process_count)
  start = process_index * base + min(process_index, extra)
  return start, start + base + int(process_index < extra)
