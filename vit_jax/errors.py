"""Errors that are the user's to fix: a config value, a path, a file. Not bugs.

The command-line tools print a `UserError` as one line, `error: <message>`, and exit
with status 1; any other exception is a bug and keeps its traceback. Each message says
what was wrong, with the value, and what to do. The subclasses keep the built-in
types callers already catch (`ValueError`, `FileNotFoundError`, `RuntimeError`).
"""


class UserError(Exception):
  """Something asked for cannot be done as asked; the message says what to change."""


class ConfigError(UserError, ValueError):
  """A config field, flag or argument has a value that cannot work."""


class MissingFileError(UserError, FileNotFoundError):
  """A file or directory that was named does not exist."""


class BadFileError(UserError, ValueError):
  """A file exists but is not what it should be (corrupt, truncated, another format)."""


class DataUnavailableError(UserError, RuntimeError):
  """A dataset is not prepared here and cannot be prepared (e.g. no network)."""


class MissingPackageError(UserError, ImportError):
  """An option needs a package that is not installed; the message says what to install."""


class OutOfMemoryError(UserError, MemoryError):
  """The device ran out of memory with these settings; the message names the ones to lower."""


class DiskFullError(UserError, OSError):
  """An output did not fit on its disk; the message names it and what is free."""
