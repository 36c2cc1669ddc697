"""The command line's flags parsed, with a user's mistakes told in one line.

`parse_flags` is absl's `flags_parser` for `python -m vit_jax.main`. A misspelt
`--config.FIELD`, a value of the wrong type, a config file that does not exist or an
argument a config file rejects (an unknown model) print `error: ...` (the close
matches of a misspelt field included) and exit with status 2. Anything else raised
while a config file runs is a bug in it and keeps its traceback.
"""

import ast
import difflib
import os
import sys

from absl import flags
import ml_collections

from vit_jax import errors

USAGE_EXIT_CODE = 2


def flag_value(argv: list[str], name: str) -> str | None:
  """The value of --NAME in argv (`--NAME=VALUE` or `--NAME VALUE`), or None."""
  for i, arg in enumerate(argv):
    if arg.startswith(f'--{name}='):
      return arg.split('=', 1)[1]
    if arg == f'--{name}' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _config_spec(argv: list[str]) -> str | None:
  return flag_value(argv, 'config')


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
  """(path, 'VALUE' or '') of each --config.PATH[=VALUE] in argv."""
  found = []
  for arg in argv:
    if arg.startswith(('--config.', '--noconfig.')):
      name, _, value = arg.partition('=')
      found.append((name.split('.', 1)[1], value))
  return found


def switch_model_if_named(config: ml_collections.ConfigDict, argv: list[str], default_spec: str):
  """With `--config.model.name=OTHER` in argv, `config.model` becomes OTHER's registry entry
  with argv's other `--config.model.FIELD` overrides (`config.switch_model`); the config
  file is --config's, else `default_spec` (as `parse_flags` takes it)."""
  paths = [path for path, _ in _overrides(argv)]
  if 'model.name' not in paths:
    return
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  set_fields = [path.split('.', 1)[1] for path in paths
                if path.startswith('model.') and path != 'model.name']
  if _config_spec(argv) is None:
    argv = [argv[0], f'--config={default_spec}', *argv[1:]]
  config_lib.switch_model(config, _load_config(argv).model.name, set_fields)


def _leaf_paths(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
  paths = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      paths += _leaf_paths(value, f'{prefix}{key}.')
    else:
      paths.append(f'{prefix}{key}')
  return paths


def _unknown_field(config: ml_collections.ConfigDict, path: str) -> str | None:
  """A one-line message if `path` names no field of `config`, else None."""
  node = config
  segments = path.split('.')
  for depth, segment in enumerate(segments):
    if isinstance(node, ml_collections.ConfigDict) and segment in node:
      node = node[segment]
      continue
    parent = '.'.join(segments[:depth])
    where = f'config.{parent}' if parent else 'the config'
    if not isinstance(node, ml_collections.ConfigDict):
      return f'--config.{path}: config.{parent} is a value, not a group of fields.'
    same_name = [p for p in _leaf_paths(config) if p.rsplit('.', 1)[-1] == segment]
    close = difflib.get_close_matches(segment, list(node.keys()), n=3, cutoff=0.6)
    close = same_name + [f'{parent}.{name}' if parent else name for name in close]
    hint = (f' Did you mean {", ".join("--config." + c for c in close)}?' if close else
            f' Its fields: {", ".join(sorted(node.keys()))}.')
    return f'--config.{path}: {where} has no field {segment!r}.{hint}'
  return None


def no_saved_config(workdir: str | None) -> str:
  """The message for a command with no --config whose --workdir holds no earlier run."""
  if workdir is None:
    return ('No --config and no --workdir given: pass --config=configs/FILE.py and '
            '--workdir=DIR, e.g. --config=configs/vit_digits.py --workdir=runs/digits.')
  return (f'No --config given and --workdir={workdir} holds no config.json of an earlier run; '
          'pass --config=configs/FILE.py, e.g. --config=configs/vit_digits.py.')


def _type_name(value) -> str:
  if isinstance(value, bool):
    return 'True or False'
  if isinstance(value, tuple):
    return "a tuple such as '(1, 2)'"
  return {int: 'an int', float: 'a number', str: 'a string'}.get(type(value), type(value).__name__)


def _load_config(argv: list[str]):
  """The config that --config names (without the overrides), run as config_flags runs it."""
  from vit_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.from_file(_config_spec(argv))


def _user_error_in_chain(error: BaseException) -> errors.UserError | None:
  """The first UserError that `error` was raised from (config files raise them), or None."""
  seen = error
  while seen is not None:
    if isinstance(seen, errors.UserError) and 'Traceback (most recent call last)' not in str(
        seen):
      return seen
    seen = seen.__cause__ or seen.__context__
  return None


def describe(error: BaseException, argv: list[str]) -> str | None:
  """The one-line message for a user's mistake that made parsing fail; None for a bug."""
  user_error = _user_error_in_chain(error)
  if user_error is not None:
    return str(user_error)
  if not isinstance(error, (flags.Error, AttributeError, KeyError)):
    return None
  try:
    config = _load_config(argv)
  except Exception:  # pylint: disable=broad-except  # The config itself fails: a bug.
    return None
  if not config.get('task'):  # No --config, and no earlier run's config in --workdir.
    return no_saved_config(flag_value(argv, 'workdir'))
  for path, value in _overrides(argv):
    unknown = _unknown_field(config, path)
    if unknown:
      return unknown
    if isinstance(error, flags.IllegalFlagValueError) and f'--config.{path}=' in str(error):
      current = config
      for segment in path.split('.'):
        current = current[segment]
      return (f'--config.{path}={value}: config.{path} takes {_type_name(current)} '
              f'(it is {current!r} now).')
  if isinstance(error, flags.Error):
    return str(error)
  return None


def _check_config_file(argv: list[str]):
  spec = _config_spec(argv)
  if spec is None:
    return
  overrides = [arg for arg in argv if arg.startswith(('--config.', '--noconfig.'))]
  given = next(i for i, arg in enumerate(argv) if arg == '--config' or arg.startswith('--config='))
  if overrides and argv.index(overrides[0]) < given:
    raise errors.ConfigError(f'{overrides[0]} comes before --config={spec}, which it overrides: '
                             'put --config=FILE first, then the --config.FIELD=VALUE overrides.')
  path = spec.split(':', 1)[0]
  if not os.path.isfile(path):
    folder = os.path.dirname(path) or '.'
    known = sorted(name for name in os.listdir(folder) if name.endswith('.py')
                   ) if os.path.isdir(folder) else []
    listing = (f' {folder} has {", ".join(known)}.' if known else
               ' Run from the repository root (configs/ is there), or give the path.')
    raise errors.ConfigError(f'--config={spec}: the config file {path} does not exist.{listing}')
  if ':' in spec and not _takes_an_argument(path):
    raise errors.ConfigError(f'--config={spec}: {path} takes no argument after the \':\'; give '
                             f'--config={path}, then --config.FIELD=VALUE to change its fields.')


def _takes_an_argument(path: str) -> bool:
  """Whether the config file's get_config has a parameter (True when that cannot be told)."""
  try:
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, ValueError):
    return True  # Its loading will say what is wrong with it.
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == 'get_config':
      return bool(node.args.args or node.args.vararg)
  return True


# The config's tuples of names; all its other tuples hold numbers.
_NAME_TUPLES = ('config.evals',)


def check_values(config: ml_collections.ConfigDict, prefix: str = 'config'):
  """Tuples of the config hold numbers (but `_NAME_TUPLES`): a tuple of words was a typo."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      check_values(value, f'{prefix}.{key}')
    elif (isinstance(value, tuple) and any(isinstance(v, str) for v in value)
          and f'{prefix}.{key}' not in _NAME_TUPLES):
      raise errors.ConfigError(f'--{prefix}.{key}={",".join(map(str, value))}: expected a tuple '
                               "of numbers such as '(2, 2)'.")


def parse_flags(argv: list[str], default_spec: str) -> list[str]:
  """absl's flags parser: FLAGS(argv), or a one-line error and exit status 2.

  Without --config in argv, `--config=default_spec` is parsed (with the overrides).
  """
  if _config_spec(argv) is None:
    argv = [argv[0], f'--config={default_spec}', *argv[1:]]
  try:
    _check_config_file(argv)
    return flags.FLAGS(argv)
  except Exception as error:  # pylint: disable=broad-except  # Sorted by `describe`.
    message = describe(error, argv)
    if message is None:
      raise
    print(f'error: {" ".join(message.split())}', file=sys.stderr)
    sys.exit(USAGE_EXIT_CODE)
