"""The --config command line, as main.py and the benchmarks read it: absl's config_flags, plus any key under
model.kwargs, loss.kwargs and task.kwargs (dicts handed to user functions as **kwargs), and one clear line for a key
that does not exist (with the nearest valid one) or a config file that fails to load.

  app.run(main, flags_parser=functools.partial(command_line.parse_flags, CONFIG))
"""

import ast
import difflib
import re
import sys

from absl import flags

from configs import base as base_config

FREE_KEYS = re.compile(r"--config\.((?:model|loss|task)\.kwargs)\.(\w+)=(.*)$", re.S)


def parse_flags(config_flag, argv):
  """absl flag parsing of argv (config_flag: config_flags.DEFINE_config_file's holder), with config-file and
  override errors turned into one line (SystemExit 'error: ...'; --debug raises them)."""
  argv, free = _split_free_overrides(argv)
  sys.argv[:] = _split_free_overrides(sys.argv)[0]  # config_flags reads its overrides from sys.argv itself
  try:
    remaining = flags.FLAGS(argv)
    if config_flag.value is not None:
      config_flag.value.keys()  # a config file that failed to load raises here, not at parse time.
      _set_free_overrides(config_flag.value, free)
    return remaining
  except (AttributeError, KeyError) as e:
    if "--debug" in argv:
      raise
    sys.exit(f"error: {_unknown_key_message(argv, e)}")
  except Exception as e:  # flags.Error, OSError from a missing config file, errors inside get_config.
    if "--debug" in argv:
      raise
    sys.exit(f"error: {last_line(e)}")


def _split_free_overrides(argv):
  """(argv without --config.model.kwargs.K=V / --config.loss.kwargs.K=V, {(group, K): V as a Python literal})."""
  kept, free = [], {}
  for arg in argv:
    match = FREE_KEYS.match(arg)
    if match:
      free[match.group(1), match.group(2)] = _literal(match.group(3))
    else:
      kept.append(arg)
  return kept, free


def _literal(text):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # a bare word is a string, as absl's own overrides treat it


def _set_free_overrides(config, free):
  for (group, key), value in free.items():
    node = config
    for part in group.split("."):
      node = node[part]
    with config.unlocked():
      node[key] = value


def _unknown_key_message(argv, error):
  """Names the --config.* override whose key does not exist, with the nearest valid key."""
  valid_config = base_config.get_config()
  for arg in argv:
    match = re.match(r"--config\.([\w.]+)=", arg)
    if not match:
      continue
    node, path = valid_config, match.group(1).split(".")
    for depth, key in enumerate(path):
      if not hasattr(node, "keys") or key not in node:
        siblings = sorted(node.keys()) if hasattr(node, "keys") else []
        close = difflib.get_close_matches(key, siblings, n=1)
        hint = f" (did you mean '{'.'.join(path[:depth] + [close[0]])}'?)" if close else ""
        return (f"unknown config key '{match.group(1)}' in {arg}{hint}; valid keys here: "
                f"{', '.join(siblings) or '(none: not a group)'}")
      node = node[key]
  return _unknown_key_in_file(argv, error)


def _unknown_key_in_file(argv, error):
  """The config file set a key configs/base.py does not define (the base config is locked)."""
  text = str(error)
  key = re.search(r'Key "(\w+)" does not exist', text)
  if not key:
    return f"unknown config key {error}"
  close = re.search(r'Did you mean "(\w+)"', text)
  config_file = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")), "the config file")
  hint = f" (did you mean '{close.group(1)}'?)" if close else ""
  return (f"{config_file} sets '{key.group(1)}', a key configs/base.py does not define{hint}; a config file may only "
          "set existing keys (model.kwargs, loss.kwargs and task.kwargs take any)")


def last_line(error):
  """The informative line of an error (config_flags wraps get_config errors in a traceback text)."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  wrapped = (isinstance(error, OSError) or lines[0] == "in user code:"
             or any(line.startswith("Traceback") for line in lines))
  line = lines[-1] if wrapped else lines[0]
  return re.sub(r"^[\w.]+(Error|Exception): ", "", line)
