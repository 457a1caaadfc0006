"""The docs cannot drift from the code: every project path they name exists, every config key they name (in a
`--config.KEY=` flag or as `group.key`) is a key of configs/base.py, and every `main.py` command in README's and
WORKSPACE's code blocks resolves its config file and overrides as main.py would (keys and value types)."""

import ast
import os
import re
import shlex

import ml_collections
import pytest

from configs import base
from tests.conftest import REPO

DOCS = ("README.md", "WORKSPACE.md", "launch/k8s/README.md", "benchmarks/README.md")
FOLDERS = ("loops", "data", "models", "configs", "launch", "examples", "tests", "benchmarks")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\b[A-Z]\b|<|\*|\{")  # configs/NAME.py, configs/X.py, <name>, globs, {split}
FREE = ("model.kwargs.", "loss.kwargs.", "task.kwargs.")  # any key: the user's own arguments


def text(doc):
  return open(os.path.join(REPO, doc)).read()


def named_paths(doc):
  """Project paths in backticks: folder/.../file.ext, folder/.../ (`examples/s`, a unit, is neither)."""
  found = re.findall(r"`((?:%s)/[\w./-]*)`" % "|".join(FOLDERS), text(doc))
  return sorted({path.rstrip("/") for path in found if not PLACEHOLDER.search(path)
                 and (path.endswith("/") or "." in path.rsplit("/", 1)[-1])})


def exists(path):
  """A file or folder, or a module's attribute (loops/distribute/steps.CallReadOut) that the module defines."""
  if os.path.exists(os.path.join(REPO, path)):
    return True
  module, _, attribute = path.rpartition(".")
  source = os.path.join(REPO, module + ".py")
  return bool(attribute) and os.path.isfile(source) and re.search(rf"^(class|def) {attribute}\b|^{attribute} =",
                                                                  open(source).read(), re.M) is not None


@pytest.mark.parametrize("doc", DOCS)
def test_every_project_path_the_docs_name_exists(doc):
  missing = [path for path in named_paths(doc) if not exists(path)]
  assert not missing, f"{doc} names paths that do not exist: {missing}"
  assert named_paths(doc)


def config_keys():
  keys = set()

  def walk(node, prefix):
    for key, value in node.items():
      name = f"{prefix}{key}"
      keys.add(name)
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, name + ".")

  walk(base.get_config(), "")
  return keys


def named_keys(doc):
  """Config keys in `--config.KEY` flags and in backticked settings `group.key=value` (group a section of the
  config; `KEY` and the like are placeholders)."""
  content = text(doc)
  groups = {key for key in config_keys() if "." not in key and isinstance(base.get_config()[key],
                                                                              ml_collections.ConfigDict)}
  flags = re.findall(r"--config\.([a-z_][\w.]*\w)", content)
  ticked = [key for key in re.findall(r"`([a-z_]+\.[a-z_][\w.]*\w)=[^`]*`", content) if key.split(".")[0] in groups]
  return sorted(set(flags + ticked))


@pytest.mark.parametrize("doc", DOCS)
def test_every_config_key_the_docs_name_is_a_key_of_the_config(doc):
  keys = config_keys()
  unknown = [key for key in named_keys(doc) if key not in keys and not key.startswith(FREE)]
  assert not unknown, f"{doc} names config keys configs/base.py does not have: {unknown}"


def main_commands(doc):
  """The arguments of every `main.py` command in the doc's indented code blocks (continued lines joined)."""
  blocks = re.findall(r"(?:^    .*\n?)+", text(doc), re.M)
  commands = []
  for block in blocks:
    joined = re.sub(r"\\\n\s*", " ", block)
    for line in joined.splitlines():
      if re.search(r"\bmain\.py --config=", line) and "..." not in line.split("main.py", 1)[1].split("#")[0]:
        commands.append(shlex.split(line.split("main.py", 1)[1].split("  #")[0].split(" # ")[0]))
  return commands


def resolved(arguments):
  """The config main.py would train with for these arguments (ValueError/KeyError/TypeError when it would not)."""
  import importlib
  spec = next(a for a in arguments if a.startswith("--config="))[len("--config="):]
  path, _, arg = spec.partition(":")
  module = importlib.import_module(path[:-3].replace("/", "."))
  config = module.get_config(arg or None)
  for argument in arguments:
    if argument.startswith("--config.") and "=" in argument:
      key, value = argument[len("--config."):].split("=", 1)
      *groups, name = key.split(".")
      node = config
      for group in groups:
        node = node[group]
      if key.startswith(FREE):
        continue
      current = node[name]
      parsed = value if isinstance(current, str) else _literal(value)
      with config.unlocked():
        node[name] = parsed  # ml_collections refuses a value of another type
  return config


def _literal(value):
  try:
    return ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return value


@pytest.mark.parametrize("doc", ["README.md", "WORKSPACE.md"])
def test_every_main_py_command_in_the_docs_resolves_its_config_and_overrides(doc):
  commands = main_commands(doc)
  assert len(commands) >= (8 if doc == "README.md" else 2), commands
  for arguments in commands:
    try:
      resolved(arguments)
    except Exception as e:  # pylint: disable=broad-except
      pytest.fail(f"{doc}: main.py {' '.join(arguments)}: {type(e).__name__}: {e}")
