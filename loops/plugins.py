"""User code named in the config as "package.module:name" (losses, metrics, callbacks): one importer, one error style."""

import importlib
import inspect

from loops.errors import ConfigError


def is_import_path(name):
  return isinstance(name, str) and ":" in name


def load(path, setting):
  """The object `name` of `package.module`; ConfigError naming `setting` and `path` when it cannot be had."""
  module_name, _, attr = path.partition(":")
  if not module_name or not attr:
    raise ConfigError(f"{setting}='{path}' must be 'package.module:name'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(f"cannot import module '{module_name}' for {setting}='{path}': {e} "
                      f"(is its folder on PYTHONPATH?)") from None
  if not hasattr(module, attr):
    raise ConfigError(f"module '{module_name}' has no '{attr}' ({setting}='{path}')")
  return getattr(module, attr)


def load_callable(path, setting, num_args):
  """load(), checked to be callable with `num_args` positional arguments."""
  fn = load(path, setting)
  if not callable(fn) or not accepts(fn, num_args):
    raise ConfigError(f"{setting}='{path}' must be a function taking {num_args} positional argument(s)"
                      f"{'' if not callable(fn) else f'; its signature is {_signature(fn)}'}")
  return fn


def accepts(fn, num_args):
  """Whether fn can be called with num_args positional arguments (True when Python cannot tell)."""
  try:
    inspect.signature(fn).bind(*range(num_args))
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
