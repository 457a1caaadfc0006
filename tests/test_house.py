"""The house's rules, read off the source: every import points down a floor (and down the rooms inside loops/),
loops/core/ is pure Python, no two classes share a name, and every room is in WORKSPACE.md's file table."""

import ast
import os
import re
import tokenize

import pytest

from tests.conftest import REPO

OURS = ("errors", "data", "models", "loops", "launch", "configs", "benchmarks", "examples", "main", "tests")
# Inside loops/: a room may import itself and the rooms after it (the top modules may import every room).
ROOMS = ("callbacks", "distribute", "task", "persist", "modeling", "private_apis", "core")


def python_files(folder):
  for root, _, files in os.walk(os.path.join(REPO, folder)):
    for name in files:
      if name.endswith(".py"):
        yield os.path.relpath(os.path.join(root, name), REPO)


def imported_modules(path):
  """Every absolute module a file imports (`from a.b import c` gives a.b and a.b.c)."""
  tree = ast.parse(open(os.path.join(REPO, path)).read())
  modules = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      modules.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      modules.add(node.module)
      modules.update(f"{node.module}.{alias.name}" for alias in node.names)
  return modules


def ours(modules):
  return {m for m in modules if m.split(".")[0] in OURS}


def room(path_or_module):
  parts = path_or_module.replace("/", ".").split(".")
  return parts[1] if len(parts) >= 2 and parts[1] in ROOMS else "top"


@pytest.mark.parametrize("folder, allowed", [("data", {"data", "errors"}), ("models", {"models", "errors"}),
                                             ("launch", {"launch"})])
def test_the_leaves_import_only_themselves_and_the_ground_floor(folder, allowed):
  for path in python_files(folder):
    wrong = {m for m in ours(imported_modules(path)) if m.split(".")[0] not in allowed}
    assert not wrong, f"{path} imports {sorted(wrong)}"


def test_the_ground_floor_imports_nothing_of_ours():
  assert not ours(imported_modules("errors.py"))


def test_inside_loops_every_import_points_down_the_rooms():
  for path in python_files("loops"):
    here = room(path)
    for module in ours(imported_modules(path)):
      if not module.startswith("loops.") or module.count(".") < 1:
        continue
      there = room(module)
      if here == "top":
        continue
      assert there != "top", f"{path} ({here}) imports the top module {module}"
      assert ROOMS.index(there) >= ROOMS.index(here), f"{path} ({here}) imports {module} ({there}): an arrow up"


def test_the_engine_reads_configs_base_in_two_places_only():
  """configs/settings.py (the settings read once) aside, which any module may import."""
  readers = sorted(path for path in python_files("loops")
                   if any(m.startswith("configs.") and m != "configs.settings" for m in ours(imported_modules(path))))
  assert readers == [os.path.join("loops", "command_line.py"), os.path.join("loops", "persist", "starts.py")], readers


def test_the_core_is_pure_python():
  for path in python_files(os.path.join("loops", "core")):
    heavy = {m for m in imported_modules(path) if m.split(".")[0] in ("tensorflow", "keras", "numpy")}
    assert not heavy, f"{path} imports {sorted(heavy)}"


def test_no_two_classes_share_a_name():
  seen = {}
  for folder in ("loops", "data", "models"):
    for path in python_files(folder):
      for node in ast.walk(ast.parse(open(os.path.join(REPO, path)).read())):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
          assert node.name not in seen, f"class {node.name} in {path} and {seen[node.name]}"
          seen[node.name] = path
  assert len(seen) > 20


def test_workspace_names_every_module_of_the_engine():
  workspace = open(os.path.join(REPO, "WORKSPACE.md")).read()
  for path in python_files("loops"):
    name = os.path.basename(path)[:-3]
    if name == "__init__":
      continue
    assert re.search(rf"\b{name}\b", workspace), f"WORKSPACE.md does not name {path}"


LONGEST_FUNCTION = 60  # lines, def to last line: a function a newcomer follows in a minute


def test_no_function_of_the_product_is_longer_than_a_newcomer_follows():
  product = [path for folder in ("loops", "data", "models", "launch") for path in python_files(folder)]
  long = []
  for path in product + ["main.py", "errors.py"]:
    for node in ast.walk(ast.parse(open(os.path.join(REPO, path)).read())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > LONGEST_FUNCTION:
          long.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
  assert not long, f"longer than {LONGEST_FUNCTION} lines: {long}"
  assert len(product) > 100


def test_workspace_phase_table_lists_the_built_ins_that_implement_each_hook():
  from loops.callbacks import built_in
  from loops.core.nan_guard import NanGuard
  from loops.persist.preemption import PreemptionWatcher
  ordered = [NanGuard, *built_in.OBSERVERS, "user callbacks", PreemptionWatcher, *built_in.SAVING]
  workspace = open(os.path.join(REPO, "WORKSPACE.md")).read()
  for hook in ("on_train_begin", "after_train_call", "after_eval", "on_call_end", "on_train_end"):
    row = next(line for line in workspace.splitlines() if line.lstrip().startswith("|") and f"`{hook}`" in line)
    listed = re.findall(r"`([A-Z]\w+)`|(user callbacks)", row.split(f"`{hook}`", 1)[1])
    expected = [c if isinstance(c, str) else c.__name__ for c in ordered if isinstance(c, str) or hook in vars(c)]
    if "user callbacks" not in row:
      expected.remove("user callbacks")
    assert [a or b for a, b in listed] == expected, hook


CLUSTER_TASK = re.compile(r"\b(non-chief|evaluator|ps|worker|peer|side|every|each|other|another|this|lost) tasks?\b"
                          r"(?! (and config|model))|\[launch\] task\b", re.I)


def cluster_tasks(text):
  return [m.group(0) for m in CLUSTER_TASK.finditer(text)]


def test_a_member_of_a_cluster_is_a_process_and_task_means_the_users_task():
  """"task" is the user's Task; a chief, worker, ps or evaluator is a process (TF_CONFIG's `task` field and SLURM's
  tasks keep their own words)."""
  files = [path for folder in ("loops", "data", "models", "launch") for path in python_files(folder)]
  files += ["main.py", "errors.py", "WORKSPACE.md", "README.md"]
  files += [os.path.join("docs", name) for name in os.listdir(os.path.join(REPO, "docs"))]
  found = {path: cluster_tasks(open(os.path.join(REPO, path)).read()) for path in files}
  assert not {path: words for path, words in found.items() if words}
  assert cluster_tasks("every task saves; the evaluator task; [launch] task worker:1 failed; this task and config") == [
      "every task", "evaluator task", "[launch] task"]


NAME = r"[a-z_][a-z0-9_]*"  # a config key's part (cluster.k8s_port)
BAG_SENTENCE = re.compile(r"The config bag is read in (\d+) modules \((\d+) distinct keys\)")


def code_only(path):
  """The file's code without its comments, docstrings and string literals (an f-string's expressions kept): a key
  named in prose or a `--config.KEY` flag in a message is no read."""
  with open(os.path.join(REPO, path), "rb") as f:
    tokens = list(tokenize.tokenize(f.readline))
  with open(os.path.join(REPO, path)) as f:
    lines = f.read().splitlines(keepends=True)
  offsets = [0]
  for line in lines:
    offsets.append(offsets[-1] + len(line))
  text = list("".join(lines))
  for token in tokens:
    if token.type in (tokenize.COMMENT, tokenize.STRING):
      first = offsets[token.start[0] - 1] + token.start[1]
      last = offsets[token.end[0] - 1] + token.end[1]
      quote = token.string[-1]
      kept = ""
      if token.type == tokenize.STRING and "f" in token.string[:token.string.index(quote)].lower():
        kept = " ".join(re.findall(r"\{([^{}]*)\}", token.string))
      text[first:last] = list(kept.ljust(last - first))
  return "".join(text)


def config_readers():
  """{module: the config keys it reads}: the modules of the product that read the bag itself (config.KEY), or that
  read a whole Settings object's sections (settings.SECTION.KEY: the bag under another name; configs/settings.py
  aside). A module given its sections (checkpoint.keep) reads no bag."""
  from configs import base
  groups = set(base.get_config().keys())
  readers = {}
  for path in [p for folder in ("loops", "data", "models", "launch") for p in python_files(folder)] + ["main.py"]:
    text = code_only(path)
    read = {key for key in re.findall(rf"(?<!tf\.)\bconfig\.({NAME}(?:\.{NAME})*)", text)  # not tf.config.optimizer
            if key.split(".")[0] in groups}
    read |= {key.removeprefix("run.") for key in re.findall(rf"\bsettings\.({NAME}\.{NAME})", text)
             if key.split(".")[0] in groups | {"run"}}
    if read:
      readers[path] = read
  return readers


def test_workspace_states_how_many_modules_read_the_config_bag():
  readers = config_readers()
  stated = BAG_SENTENCE.search(" ".join(open(os.path.join(REPO, "WORKSPACE.md")).read().split()))
  assert stated, f"WORKSPACE.md lacks the sentence {BAG_SENTENCE.pattern!r}"
  measured = (len(readers), len(set().union(*readers.values())))
  assert measured == tuple(map(int, stated.groups())), f"WORKSPACE.md states {stated.groups()}, measured {measured}"
  assert "loops/rules.py" in readers and "train" in set().union(*readers.values())
