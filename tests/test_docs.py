"""The docs cannot drift from the code. For README.md, WORKSPACE.md, every docs/*.md and the other READMEs: every
project path, module and module attribute they name exists; every config key they name is a key of configs/base.py;
files named without their folders, the classes in the parentheses after a file, and the names in a table's module
column exist (a room's relative to its folder); a sentence saying a test enforces or checks something names the test;
every relative link and anchor resolves (GitHub's heading slugs); every `python main.py ...` command in a code block
passes `--dry_run`, or, when it needs a cluster or data that is not on this machine, resolves its config file and
overrides (keys and value types) as main.py would. docs/configuration.md lists every key and no other. Planted
mistakes prove that each checker reports what it should."""

import ast
import glob
import importlib
import os
import posixpath
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


# --- names without their folder, module tables, claims that a test holds something ----------------------------


def project_entries():
  """Every file and folder of the project, relative to the repository ('loops/persist/checkpoints.py')."""
  entries = set()
  for folder in FOLDERS + (".ci",):
    for path in glob.glob(os.path.join(REPO, folder, "**"), recursive=True):
      if "__pycache__" not in path:
        entries.add(os.path.relpath(path, REPO).rstrip("/"))
  return entries | {name for name in os.listdir(REPO) if os.path.isfile(os.path.join(REPO, name))}


ENTRIES = project_entries()


def resolves(name, folder=""):
  """A file or folder named without its leading folders (`persist/checkpoints.py`, `rules.py`, `slurm/`), or,
  with the folder of a table's row, a module, package or file of that folder."""
  name = name.rstrip("/")
  if folder:
    within = posixpath.join(folder.rstrip("/"), name.removeprefix(folder))
    return within in ENTRIES or within + ".py" in ENTRIES
  return any(entry == name or entry.endswith("/" + name) for entry in ENTRIES)


def short_paths(content):
  """Backticked `.py` files named without the folders (`distribute/execution.py`, `rules.py`): the full
  paths are `named_paths`'."""
  return sorted({t for t in ticked(content) if re.fullmatch(r"[\w/]+\.py", t) and not PLACEHOLDER.search(t)
                 and not re.match(r"(?:%s)/" % "|".join(FOLDERS), t)})


def defined_after_paths(content):
  """(file, class): the classes in the parentheses right after a backticked file, `path.py` (`Name`, ...)."""
  pairs = []
  for path, inside in re.findall(r"`([\w/]+\.py)` \(([^()]*)\)", content):
    pairs += [(path, name) for name in re.findall(r"`([A-Z][a-z]\w*)(?:\.\w+)*(?:\(\))?`", inside)]
  return pairs


def file_defines(path, name):
  candidates = [entry for entry in ENTRIES if entry == path or entry.endswith("/" + path)]
  return any(defines(os.path.splitext(entry)[0].replace("/", "."), name) for entry in candidates)


def module_tables(content):
  """(folder, names) of each row of a table with a `module`, `modules` or `file` column: the backticked
  names outside parentheses of that column, and the row's folder when its first column is one (`loops/core/`)."""
  rows, column = [], None
  for line in content.splitlines():
    if not line.startswith("|"):
      column = None
      continue
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if column is None:
      column = max((i for i, cell in enumerate(cells) if cell in ("module", "modules", "file")), default=-1)
      continue
    if column < 0 or set(cells[0]) <= set("-: ") or column >= len(cells):
      continue
    listed = cells[column]
    while re.search(r"\([^()]*\)", listed):
      listed = re.sub(r"\([^()]*\)", "", listed)
    folder = re.fullmatch(r"`([\w/]+/)`", cells[0])
    folder = folder.group(1) if folder and column > 0 else ""
    rows.append((folder, [t for t in ticked(listed) if not PLACEHOLDER.search(t)]))
  return rows


def name_problems(content):
  problems = [f"file {name}" for name in short_paths(content) if not resolves(name)]
  problems += [f"{name} in {path}" for path, name in defined_after_paths(content)
               if resolves(path) and not file_defines(path, name)]
  for folder, names in module_tables(content):
    problems += [f"module {folder}{name}" for name in names
                 if not resolves(name, folder) and not module_exists(f"{folder}{name}".strip("/").replace("/", "."))]
  return problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_and_module_named_without_its_folder_exists(doc):
  problems = name_problems(text(doc))
  assert not problems, f"{doc} names what does not exist: {problems}"


def test_workspace_rooms_table_is_read_room_by_room():
  rows = [(folder, names) for folder, names in module_tables(text("WORKSPACE.md")) if folder]
  assert len(rows) >= 9 and sum(len(names) for _, names in rows) > 80

CLAIM = re.compile(r"\benforce[sd]?\b|\b(is|are) tested\b|\btested (verbatim|as written)\b|"
                   r"\btests? (checks?|asserts?|holds?|pins?|verif(y|ies))\b", re.I)


def claims_without_their_test(content):
  """Sentences saying a test holds something that name no test (`tests/test_x.py` or a `test_...` function)."""
  pieces = re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |#|\|))", prose(content))  # paragraphs, items, rows
  sentences = [s for piece in pieces for s in re.split(r"(?<=[.;])\s+(?=[A-Z(`])", re.sub(r"\s+", " ", piece))]
  return [s for s in sentences if CLAIM.search(s) and not re.search(r"`(tests/)?test_\w+(\.py)?(::\w+)?`", s)]


@pytest.mark.parametrize("doc", DOCS)
def test_a_sentence_saying_a_test_holds_something_names_the_test(doc):
  assert not claims_without_their_test(text(doc)), claims_without_their_test(text(doc))


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


def test_the_configuration_reference_is_generated_from_configs_base_and_explains_every_key():
  assert text("docs/configuration.md") == base.reference(), "rerun: python -m configs.base > docs/configuration.md"
  unexplained = re.findall(r"^\| `([\w.]+)` \| .*? \|  \|$", base.reference(), re.M)
  assert not unexplained, f"configs/base.py has no comment on {unexplained}"
  assert base.meanings("  # the seed\n  c.seed = 0\n  c.mode = 'train'  # train | evaluate\n  c.x = 1\n") == {
      "seed": "the seed", "mode": "train | evaluate", "x": ""}


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


PLANTED_ROOMS = """
| room | modules |
| --- | --- |
| `loops/persist/` | `checkpoints` (`Checkpoints`), `console` (the live bar), `writers` |
| `models/` | `MODELS`, `get`, `cnn.py`, `vit.py` |

- **a step**: `distribute/execution.py` (`SyncExecution`) → `distribute/step.py` (`CallReadOut`); `rules.py`.
- **an eval**: `distribute/steps.py` (`NoSuchRunner`); the rules in `check_rules.py`.

The floors are enforced by a test. `tests/test_house.py` enforces the floors.
"""


def test_the_name_checker_reports_a_renamed_module_in_a_table_a_short_path_and_a_class():
  assert name_problems(PLANTED_ROOMS) == [
      "file check_rules.py", "file distribute/step.py", "file vit.py", "NoSuchRunner in distribute/steps.py",
      "module loops/persist/console", "module models/vit.py"]


def test_a_claim_that_a_test_holds_something_must_name_it():
  assert claims_without_their_test(PLANTED_ROOMS) == ["The floors are enforced by a test."]

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
