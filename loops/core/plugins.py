"""User code named in the config as "package.module:name" or "path/to/file.py:name" (models, losses, metrics,
callbacks, tasks): one importer (data/user_code.py), one error style."""

import inspect

from data import user_code
from errors import ConfigError


def is_import_path(name):
  return isinstance(name, str) and ":" in name


def load(path, setting):
  """The object `name` of `package.module` or of `path/to/file.py`; ConfigError naming `setting` and `path` when it
  cannot be had."""
  return user_code.named(path, setting)


def load_callable(path, setting, num_args, keywords=()):
  """load(), checked to be callable with `num_args` positional arguments (and whichever of the optional
  `keywords` it declares)."""
  fn = load(path, setting)
  if not callable(fn) or not accepts(fn, num_args, keywords):
    raise ConfigError(f"{setting}='{path}' must be a function taking {num_args} positional argument(s)"
                      f"{'' if not callable(fn) else f'; its signature is {_signature(fn)}'}")
  return fn


def check_call(fn, args, kwargs, setting, name):
  """ConfigError naming `setting` unless fn(*args, **kwargs) fits fn's signature (a wrong model.kwargs key)."""
  try:
    inspect.signature(fn).bind(*args, **kwargs)
  except TypeError as e:
    raise ConfigError(f"{setting} {dict(kwargs)} do not fit {name}: {e}; its signature is {_signature(fn)}") from None
  except ValueError:  # no signature (some builtins)
    pass


def declared_keywords(fn, names):
  """The subset of `names` that fn declares as parameters (or all of them, when fn takes **kwargs)."""
  try:
    parameters = inspect.signature(fn).parameters
  except ValueError:
    return ()
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
    return tuple(names)
  return tuple(n for n in names if n in parameters)


def accepts(fn, num_args, keywords=()):
  """Whether fn can be called with num_args positional arguments and the `keywords` it declares (True when
  Python cannot tell)."""
  try:
    inspect.signature(fn).bind(*range(num_args), **dict.fromkeys(declared_keywords(fn, keywords)))
  except TypeError:
    return False
  except ValueError:  # no signature (some builtins)
    return True
  return True


def _signature(fn):
  try:
    return f"{getattr(fn, '__name__', 'fn')}{inspect.signature(fn)}"
  except ValueError:
    return "unknown"
