"""User code named in the config (a model, task, loss, metric, callback or data function): "package.module:name",
or "path/to/file.py:name" (relative to the working directory, or absolute). The one importer of loops/core/plugins.py
and data/user_source.py, with one error style.

A researcher's repository often has its own `models/`, `data/` or `configs/`: as a module, `models.mynet` then
names this framework's package, so that case is said in one line with the file form that reaches theirs.
"""

import importlib
import importlib.util
import os
import re
import sys
import traceback

from errors import ConfigError

FRAMEWORK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_file(where):
  """True when the part before ':' names a Python file rather than a module."""
  return where.endswith(".py") or "/" in where or os.sep in where


def named(path, setting):
  """The object `name` of "module:name" or "file.py:name"; ConfigError naming `setting` when it cannot be had."""
  where, _, attr = path.rpartition(":")
  if not where or not attr:
    raise ConfigError(f"{setting}='{path}' must be 'package.module:name' or 'path/to/file.py:name'")
  try:
    module = _from_file(where, path, setting) if is_file(where) else _imported(where, path, setting)
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # the user's module fails as it is imported
    raise ConfigError(f"{setting}='{path}': importing {where} failed: {type(e).__name__}: {_said(e)}") from e
  if not hasattr(module, attr):
    raise ConfigError(f"{'file' if is_file(where) else 'module'} '{where}' has no '{attr}' ({setting}='{path}')")
  return getattr(module, attr)


def _said(error):
  """The error's first line and where in the user's code it was raised (a SyntaxError: its file and line)."""
  text = (str(error).strip().splitlines() or [""])[0]
  if isinstance(error, SyntaxError) and error.filename:
    return f"{error.msg} (in {error.filename}:{error.lineno})"
  frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")
            and "site-packages" not in frame.filename and not frame.filename.startswith(FRAMEWORK + os.sep + "data")]
  return text + (f" (in {frames[-1].filename}:{frames[-1].lineno})" if frames else "")


def _imported(module_name, path, setting):
  try:
    return importlib.import_module(module_name)
  except ImportError as e:
    shadowing = _framework_package(module_name)
    if shadowing:
      raise ConfigError(f"cannot import module '{module_name}' for {setting}='{path}': '{shadowing}' is this "
                        f"framework's own package ({shadowing}/), which hides yours of the same name; name your code "
                        f"by its file: {setting}=path/to/{module_name.replace('.', '/')}.py:"
                        f"{path.rpartition(':')[2]}") from None
    raise ConfigError(f"cannot import module '{module_name}' for {setting}='{path}': {e} "
                      f"(is its folder on PYTHONPATH? or name the file: path/to/file.py:name)") from None


def _framework_package(module_name):
  """The top package of `module_name` when it is this framework's (loops, models, data, ...), else None."""
  top = module_name.split(".")[0]
  found = sys.modules.get(top)
  if found is None:
    spec = importlib.util.find_spec(top)
    origin = spec.origin if spec else None
  else:
    origin = getattr(found, "__file__", None)
  inside = origin and os.path.dirname(os.path.dirname(os.path.abspath(origin))) == FRAMEWORK
  return top if inside and "." in module_name else None


def _from_file(where, path, setting):
  """The module of the file `where` (loaded once per absolute path; its folder added to sys.path, last, for its
  own imports of the modules beside it)."""
  filename = os.path.abspath(os.path.expanduser(where))
  if not os.path.isfile(filename):
    raise ConfigError(f"{setting}='{path}': no file {filename} (a path is relative to the working directory "
                      f"{os.getcwd()})")
  name = "user_code_" + re.sub(r"\W", "_", filename)
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, filename)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  folder = os.path.dirname(filename)
  if folder not in sys.path:
    sys.path.append(folder)
  try:
    spec.loader.exec_module(module)
  except Exception:
    del sys.modules[name]
    raise
  return module
