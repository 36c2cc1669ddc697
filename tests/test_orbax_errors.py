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


def test_why_names_the_file_of_the_error_orbax_wrapped():
  inner = ValueError('OUT_OF_RANGE: Error reading Byte range [0, 100) of local file '
                     '"/w/checkpoints/40/default/d/abc": Requested byte range [0, 100) is not '
                     "valid for value of size 50 [tensorstore_spec='{}']")
  try:
    try:
      raise inner
    except ValueError as error:
      raise ValueError('Encountered error while reading array index: (slice(0, 4, 1),). See '
                       'full TensorStore details: <bound method spec of TensorStore({') from error
  except ValueError as outer:
    assert orbax_errors.why(outer) == ('/w/checkpoints/40/default/d/abc: Requested byte range '
                                       '[0, 100) is not valid for value of size 50')


def test_first_line_leaves_out_the_tensorstore_spec():
  error = ValueError('Encountered error while reading array index: (slice(0, 4, 1),). See full '
                     'TensorStore details: <bound method spec of TensorStore({"driver": 1')
  assert orbax_errors.first_line(error) == ('Encountered error while reading array index: '
                                            '(slice(0, 4, 1),).')
