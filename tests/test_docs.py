"""The docs cannot drift from the code. For README.md, WORKSPACE.md, every docs/*.md and the other READMEs: every
project path, module and module attribute they name exists; every config key they name is a key of configs/base.py;
every relative link and anchor resolves (GitHub's heading slugs); every `python main.py ...` command in a code block
passes `--dry_run`, or, when it needs a cluster or data that is not on this machine, resolves its config file and
overrides (keys and value types) as main.py would. docs/configuration.md lists every key and no other. Planted
mistakes prove that each checker reports what it should."""

import ast
import glob
import importlib
import os
import re
import shlex
import sys

import ml_collections
import pytest

from configs import base
from tests.conftest import REPO, run_command

DOCS = ("README.md", "WORKSPACE.md", "launch/k8s/README.md", "benchmarks/README.md",
        *sorted(os.path.relpath(path, REPO) for path in glob.glob(os.path.join(REPO, "docs", "*.md"))))
PAGES = ("quickstart", "tasks", "data", "clusters", "reliability", "sweeps", "monitoring", "after_training", "serving",
         "configuration", "performance")
FOLDERS = ("loops", "data", "models", "configs", "launch", "examples", "tests", "benchmarks", "docs")
PACKAGES = ("loops", "data", "models", "launch", "configs", "examples", "benchmarks")
ROOT_FILES = re.compile(r"^\w+\.(py|md|txt|ini)$")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\b[A-Z]\b|<|\*|\{")  # configs/NAME.py, configs/X.py, <name>, globs, {split}
FREE = ("model.kwargs.", "loss.kwargs.", "task.kwargs.")  # any key: the user's own arguments
FILE_NAME = re.compile(r"\.(json|jsonl|lock|png|csv|md|py|keras|h5|log|txt|pb|yaml|npy|npz)$")
LOCAL_DATA = ("digits", "synthetic")
LAUNCHERS = re.compile(r"\b(launch\.local|mpirun|mpiexec|srun|sbatch|horovodrun|TF_CONFIG|kubectl)\b")
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server", "tpu")


def text(doc):
  return open(os.path.join(REPO, doc)).read()


def prose(content):
  """The text outside fenced code blocks (where a `# comment` is no heading)."""
  return re.sub(r"^```.*?^```", "", content, flags=re.M | re.S)


# --- paths, modules, attributes -------------------------------------------------------------------------------


def ticked(content):
  return re.findall(r"`([^`\n]+)`", content)


def named_paths(content):
  """Project paths in backticks: folder/.../file.ext, folder/.../, a root file (`main.py`), a path's attribute
  (`loops/distribute/steps.CallReadOut`)."""
  found = [t for t in ticked(content) if re.fullmatch(r"(?:%s)/[\w./-]*" % "|".join(FOLDERS), t)]
  paths = {path.rstrip("/") for path in found if not PLACEHOLDER.search(path)
           and (path.endswith("/") or "." in path.rsplit("/", 1)[-1])}
  paths |= {t for t in ticked(content) if ROOT_FILES.match(t) and os.path.splitext(t)[0] in
            ("main", "errors", "README", "WORKSPACE", "requirements", "pytest")}
  return sorted(paths)


def exists(path):
  """A file or folder, or a module's attribute (loops/distribute/steps.CallReadOut) that the module defines."""
  if os.path.exists(os.path.join(REPO, path)):
    return True
  module, _, attribute = path.rpartition(".")
  return bool(attribute) and defines(module.replace("/", "."), attribute)


def module_file(dotted):
  """The source file of a project module (package/__init__.py or module.py), else None."""
  base_path = os.path.join(REPO, *dotted.split("."))
  for candidate in (base_path + ".py", os.path.join(base_path, "__init__.py")):
    if os.path.isfile(candidate):
      return candidate
  return None


def defines(module, attribute):
  """Whether the module's source defines or imports `attribute`, or has it as a submodule."""
  if module_file(f"{module}.{attribute}"):
    return True
  source = module_file(module)
  if source is None:
    return False
  pattern = (rf"^\s*(class|def) {attribute}\b|^{attribute}\s*[:=]|^\s*(from \S+ )?import .*\b{attribute}\b"
             rf"|[\"']{attribute}[\"']: [\"']")  # a lazily imported name (data/__init__.py's _WHERE)
  return re.search(pattern, open(source).read(), re.M) is not None


def named_modules(content):
  """Dotted project names in backticks (`loops.task.Task`, `data.sources.SOURCES`) and `python -m` modules;
  config keys (`data.name`) and file names (`summary.json`) are not modules."""
  names = {t for t in ticked(content) if re.fullmatch(r"(?:%s)(?:\.\w+)+" % "|".join(PACKAGES), t)
           and not FILE_NAME.search(t) and not is_config_key(t)}
  names |= set(re.findall(r"python -m ((?:%s)(?:\.\w+)+)" % "|".join(PACKAGES), content))
  return sorted(names)


def module_exists(dotted):
  """The longest importable prefix is a project module, and each remaining part an attribute it defines."""
  parts = dotted.split(".")
  for cut in range(len(parts), 0, -1):
    if module_file(".".join(parts[:cut])):
      rest = parts[cut:]
      return not rest or defines(".".join(parts[:cut]), rest[0])
  return False


def path_problems(content):
  return ([f"path {path}" for path in named_paths(content) if not exists(path)]
          + [f"module {name}" for name in named_modules(content) if not module_exists(name)])


@pytest.mark.parametrize("doc", DOCS)
def test_every_project_path_and_module_the_docs_name_exists(doc):
  problems = path_problems(text(doc))
  assert not problems, f"{doc} names what does not exist: {problems}"


# --- config keys ------------------------------------------------------------------------------------------------


def config_keys():
  keys = set()

  def walk(node, prefix):
    for key, value in node.items():
      keys.add(f"{prefix}{key}")
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f"{prefix}{key}.")

  walk(base.get_config(), "")
  return keys


KEYS = config_keys()
GROUPS = {key for key in KEYS if "." not in key and isinstance(base.get_config()[key], ml_collections.ConfigDict)}


def is_config_key(name):
  return name in KEYS or name.startswith(FREE)


def named_keys(content):
  """Config keys in `--config.KEY` flags, in backticked settings `group.key=value` and as backticked `group.key`
  (group a section of the config; `KEY` and the like are placeholders)."""
  flags = re.findall(r"--config\.([a-z_][\w.]*\w)", content)
  ticked_keys = [t.split("=", 1)[0] for t in ticked(content)
                 if re.fullmatch(r"[a-z_]+(?:\.[a-z_][\w]*)+(=.*)?", t) and t.split(".")[0] in GROUPS]
  ticked_keys = [key for key in ticked_keys if not FILE_NAME.search(key) and not module_exists(key)]
  return sorted(set(flags + ticked_keys))


def key_problems(content):
  return [f"config key {key}" for key in named_keys(content) if not is_config_key(key)]


@pytest.mark.parametrize("doc", DOCS)
def test_every_config_key_the_docs_name_is_a_key_of_the_config(doc):
  problems = key_problems(text(doc))
  assert not problems, f"{doc} names config keys configs/base.py does not have: {problems}"


def reference_keys():
  """The keys the reference must list: every key that holds a value, and the free kwargs groups."""
  return {key for key in KEYS if key.endswith(".kwargs") or not any(k.startswith(key + ".") for k in KEYS)}


def test_the_configuration_reference_lists_every_key_and_no_other():
  listed = re.findall(r"^\| `([\w.]+)` \|", text("docs/configuration.md"), re.M)
  assert len(listed) == len(set(listed)), "docs/configuration.md lists a key twice"
  assert not reference_keys() - set(listed), f"missing from docs/configuration.md: {reference_keys() - set(listed)}"
  assert not set(listed) - reference_keys(), f"not keys of configs/base.py: {set(listed) - reference_keys()}"


def shown_default(value):
  if isinstance(value, ml_collections.ConfigDict):
    return "{}"
  return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def test_the_configuration_reference_gives_each_key_its_default():
  def value(key):
    node = base.get_config()
    for part in key.split("."):
      node = node[part]
    return node

  rows = re.findall(r"^\| `([\w.]+)` \| (.*?) \| ", text("docs/configuration.md"), re.M)
  wrong = [(key, shown) for key, shown in rows if shown != shown_default(value(key))]
  assert len(rows) == len(reference_keys())
  assert not wrong, f"docs/configuration.md shows other defaults than configs/base.py: {wrong}"


# --- links and anchors ------------------------------------------------------------------------------------------


def slugs(content):
  """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens, -1, -2 for
  repeats."""
  seen, anchors = {}, set()
  for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(content), re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f"{slug}-{count}")
  return anchors


def link_problems(content, doc):
  """Relative links whose file does not exist or whose #anchor is no heading of it."""
  problems = []
  for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", prose(content))):
    if re.match(r"[a-z]+:", target):
      continue  # http(s), mailto
    path, _, anchor = target.partition("#")
    if not path:
      if anchor not in slugs(content):
        problems.append(f"link {target}: no heading #{anchor} in {doc}")
      continue
    linked = os.path.normpath(os.path.join(os.path.dirname(doc), path))
    full = os.path.join(REPO, linked)
    if not os.path.exists(full):
      problems.append(f"link {target}: no file {linked}")
    elif anchor and (not os.path.isfile(full) or anchor not in slugs(open(full).read())):
      problems.append(f"link {target}: no heading #{anchor} in {linked}")
  return problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_and_anchor_resolves(doc):
  problems = link_problems(text(doc), doc)
  assert not problems, f"{doc}: {problems}"


def test_readme_links_every_guide_and_every_guide_exists():
  for page in PAGES:
    assert f"(docs/{page}.md)" in text("README.md"), page
  assert {f"docs/{page}.md" for page in PAGES} <= set(DOCS)


# --- main.py commands -------------------------------------------------------------------------------------------


def code_lines(content):
  """(line number, line) of every line in an indented or fenced code block, continued lines joined."""
  found, fenced, pending = [], False, None
  for number, line in enumerate(content.splitlines(), 1):
    if line.startswith("```"):
      fenced = not fenced
      continue
    if not (fenced or line.startswith(("    ", "\t"))):
      pending = None
      continue
    if pending is not None:
      found[-1] = (found[-1][0], found[-1][1] + " " + line.strip().rstrip("\\").strip())
    else:
      found.append((number, line.rstrip("\\").strip()))
    pending = True if line.rstrip().endswith("\\") else None
  return found


def main_commands(content):
  """(line number, line, arguments) of every complete `python main.py` command in the doc's code blocks (`...`
  elides: skipped)."""
  commands = []
  for number, line in code_lines(content):
    if not re.search(r"\bmain\.py --config=", line):
      continue
    arguments = line.split("main.py", 1)[1].split("  #")[0].split(" # ")[0]
    if "..." not in arguments:
      commands.append((number, line, shlex.split(arguments)))
  return commands


def resolved(arguments):
  """The config main.py would train with for these arguments (ValueError/KeyError/TypeError when it would not)."""
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


def needs(line, arguments):
  """What a command needs that is not here ("" when a dry run can check it whole)."""
  config = resolved(arguments)
  data = config.data.name
  if LAUNCHERS.search(line) or config.strategy in CLUSTER_STRATEGIES:
    return "cluster"
  if "$" in line:
    return "environment"
  if data not in LOCAL_DATA and (":" not in data or data.startswith("tfds:")) or config.data.data_dir:
    return "data"
  if (config.init.checkpoint or config.model.kwargs.get("weights") or config.task.name.endswith(":Distill")
      or config.mode == "predict" or config.eval.checkpoint):
    return "a trained run"
  return ""


def command_problems(content):
  """Commands whose config file or overrides main.py would refuse (keys and value types)."""
  problems = []
  for _, line, arguments in main_commands(content):
    try:
      resolved(arguments)
    except Exception as e:  # pylint: disable=broad-except
      problems.append(f"main.py {' '.join(arguments)}: {type(e).__name__}: {e}")
  return problems


def all_commands():
  """(doc:line, line, arguments, what it needs) for every main.py command of every doc."""
  return [(f"{doc}:{number}", line, arguments, needs(line, arguments))
          for doc in DOCS for number, line, arguments in main_commands(text(doc))]


COMMANDS = all_commands()


def command_id(command):
  where, _, _, need = command
  return f"{where}:" + (f"keys-only({need})" if need else "dry_run")


@pytest.mark.parametrize("doc", DOCS)
def test_every_main_py_command_resolves_its_config_and_overrides(doc):
  problems = command_problems(text(doc))
  assert not problems, f"{doc}: {problems}"


def test_the_guides_show_commands_and_most_of_them_dry_run():
  assert sum(1 for command in COMMANDS if command[0].startswith("docs/")) >= 15
  assert sum(1 for command in COMMANDS if not command[3]) >= 10


def dry_run_arguments(arguments, workdir):
  """The command as a dry run: --find and --check dropped (they cannot combine with it), its own workdir."""
  kept = [a for a in arguments if not a.startswith(("--workdir", "--find", "--check", "--dry_run"))]
  return [*kept, f"--workdir={workdir}", "--dry_run"]


PLANTED = ["--config=configs/digits_cnn.py", "--config.optimizer.name=sgdd"]  # a value only the dry run refuses


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
  """{command index: (exit code, last line)}: every command a dry run can check whole, and the planted one, each run
  as run_main runs main.py (forked from one import of TensorFlow); the last line is the last `error:` line, if any."""
  chosen = [i for i, command in enumerate(COMMANDS) if not command[3]]
  workdir = tmp_path_factory.mktemp("dry_runs")
  batch = [dry_run_arguments(COMMANDS[i][2], workdir / str(i)) for i in chosen]
  batch.append(dry_run_arguments(PLANTED, workdir / "planted"))
  results = {}
  for index, arguments in zip(chosen + ["planted"], batch):
    done = run_command([sys.executable, "main.py", *map(str, arguments)],
                       env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, timeout=300, merge_output=True)
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    results[index] = (done.returncode, (errors or lines or [""])[-1])
  return results


@pytest.mark.e2e
@pytest.mark.parametrize("index", [i for i, c in enumerate(COMMANDS) if not c[3]],
                         ids=[command_id(c) for c in COMMANDS if not c[3]])
def test_every_main_py_command_passes_dry_run(index, dry_runs):
  code, last = dry_runs[index]
  assert code == 0, f"{COMMANDS[index][0]}: exit {code}: {last}"


@pytest.mark.parametrize("index", [i for i, c in enumerate(COMMANDS) if c[3]],
                         ids=[command_id(c) for c in COMMANDS if c[3]])
def test_commands_that_need_a_cluster_or_data_resolve_their_keys(index):
  resolved(COMMANDS[index][2])


@pytest.mark.e2e
def test_a_planted_bad_value_fails_the_dry_run(dry_runs):
  code, last = dry_runs["planted"]
  assert code == 1 and "unknown optimizer 'sgdd'" in last, (code, last)


# --- planted mistakes: each checker reports them ----------------------------------------------------------------


PLANTED_PAGE = """# A page

## Real heading

See `loops/run.py`, `loops/no_such_room.py`, `loops.task.Task`, `loops.task.NoSuchThing`, `data.sources.SOURCES`.
Set `optimizer.learning_rate=0.1` or `--config.optimizer.lerning_rate=0.1`; `train.stepz` is not a key.
Links: [ok](quickstart.md#install-and-train), [gone](no_such_page.md), [bad anchor](quickstart.md#no-such-heading),
[here](#real-heading), [not here](#unreal-heading).

    python main.py --config=configs/digits_cnn.py --workdir=runs/x --config.train.stepz=3
    python main.py --config=configs/digits_cnn.py --workdir=runs/x --config.train.steps=three
    python main.py --config=configs/digits_cnn.py --workdir=runs/x --config.train.steps=3
"""


def test_the_path_checker_reports_a_planted_broken_path_and_module():
  assert path_problems(PLANTED_PAGE) == ["path loops/no_such_room.py", "module loops.task.NoSuchThing"]


def test_the_key_checker_reports_a_planted_broken_key():
  assert key_problems(PLANTED_PAGE) == ["config key optimizer.lerning_rate", "config key train.stepz"]


def test_the_link_checker_reports_a_planted_broken_link_and_anchors():
  assert link_problems(PLANTED_PAGE, "docs/planted.md") == [
      "link no_such_page.md: no file docs/no_such_page.md",
      "link quickstart.md#no-such-heading: no heading #no-such-heading in docs/quickstart.md",
      "link #unreal-heading: no heading #unreal-heading in docs/planted.md"]


def test_the_command_checker_reports_a_planted_broken_key_and_type():
  problems = command_problems(PLANTED_PAGE)
  assert len(problems) == 2 and "train.stepz" in problems[0] and "three" in problems[1], problems


def test_slugs_follow_github():
  assert slugs("# A / b\n## `summary.json`\n## Find a learning rate / batch size\n## A / b\n") == {
      "a--b", "summaryjson", "find-a-learning-rate--batch-size", "a--b-1"}


def test_commands_are_sorted_by_what_they_need():
  assert needs("python -m launch.local --workers 2 -- python main.py", ["--config=configs/digits_cnn.py"]) == "cluster"
  assert needs("python main.py", ["--config=configs/mnist_cnn.py"]) == "data"
  assert needs("python main.py", ["--config=configs/digits_cnn.py", "--config.init.checkpoint=runs/x"]) == "a trained run"
  assert needs("python main.py", ["--config=configs/tasks.py:sequence"]) == ""


HISTORY = re.compile(r"\bissue \d+|\bused to\b|before the (fix|change)|\bno longer\b|\bnow (runs|is|does|has)\b|"
                     r"\bthe old (code|way)\b", re.I)


@pytest.mark.parametrize("doc", [doc for doc in DOCS if doc.startswith("docs/") or doc in ("README.md", "WORKSPACE.md")])
def test_the_guides_say_what_is_not_how_it_came_to_be(doc):
  assert not HISTORY.search(text(doc)), [m.group(0) for m in HISTORY.finditer(text(doc))]
  assert HISTORY.search("the report used to show old metrics (issue 35)")
