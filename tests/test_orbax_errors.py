"""Orbax's leftovers after a failed read or write are dropped; everything else is kept."""

import logging

from vit_jax.train import orbax_errors


def _record(name, message, level=logging.ERROR):
  return logging.LogRecord(name, level, '/usr/lib/python3/asyncio/base_events.py', 1771,
                           message, None, None)


def test_unretrieved_tensorstore_read_tasks_are_dropped():
  keep = orbax_errors._SaveErrorTraceback().filter
  # What asyncio logs for a read task of a truncated checkpoint: it names no orbax module.
  read = ("Task exception was never retrieved\nfuture: <Task finished name='Task-93' "
          "coro=<_wrap_awaitable() done> exception=ValueError('OUT_OF_RANGE: Error opening "
          "\"zarr\" driver [tensorstore_spec=\\'{}\\']')>")
  write = ("Task exception was never retrieved\nfuture: <Task finished coro=<"
           "orbax.checkpoint._src.serialization.async_serialize() done>>")
  assert not keep(_record('asyncio', read))
  assert not keep(_record('asyncio', write))


def test_other_errors_are_kept():
  keep = orbax_errors._SaveErrorTraceback().filter
  assert keep(_record('asyncio', "Task exception was never retrieved\nfuture: <Task "
                      "finished coro=<my_job() done> exception=ValueError('mine')>"))
  assert keep(_record('absl', 'orbax could not find the directory'))  # No traceback: kept.
  assert keep(_record('asyncio', 'tensorstore_spec never retrieved', logging.WARNING))
