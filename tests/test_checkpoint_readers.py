"""One owner reads checkpoints: loops/persist/checkpoints.py (and its warm-start reader, init_checkpoint.py). Every
other module of the product is read with `ast` for a checkpoint-reading call; the few declared below say why."""

import ast
import os

import pytest

from tests.conftest import REPO

PRODUCT = ("loops", "data", "models", "launch", "main.py", "errors.py")
OWNER = ("loops/persist/checkpoints.py", "loops/persist/init_checkpoint.py")
# Outside the owner, each reading name allowed in one file, and why.
DECLARED = {
    ("loops/persist/preemption.py", "PreemptionCheckpointHandler"):
        "restores the latest checkpoint when made; made in PreemptionWatcher only",
    ("loops/distribute/execution.py", "PreemptionWatcher"):
        "Execution.preemption, the factory run.py hands to Checkpoints.restore_run (nobody else calls it)",
    ("launch/sweep_report.py", "model_checkpoint_path"):
        "last_saved_step: the index's latest step for the report (launch/ is pure Python: no TF, no loops/)",
}
# Called, imported or named anywhere: each reads a checkpoint or its index, or makes what does.
READING = {"latest_checkpoint", "load_checkpoint", "list_variables", "NewCheckpointReader", "CheckpointReader",
           "get_checkpoint_state", "restore_or_initialize", "checkpoints_iterator", "checkpoint_management",
           "load_weights", "PreemptionCheckpointHandler", "PreemptionWatcher", "init_checkpoint"}
INDEX_FIELD = "model_checkpoint_path"  # the index's text, parsed by hand


def product_files():
  for entry in PRODUCT:
    if entry.endswith(".py"):
      yield entry
      continue
    for root, _, files in os.walk(os.path.join(REPO, entry)):
      yield from (os.path.relpath(os.path.join(root, n), REPO).replace(os.sep, "/") for n in files if n.endswith(".py"))


def _names(node):
  """The names a node brings in or uses: an import's modules and aliases, a name, an attribute."""
  if isinstance(node, (ast.Import, ast.ImportFrom)):
    found = [part for alias in node.names for part in alias.name.split(".")]
    return found + (node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else [])
  if isinstance(node, ast.Name):
    return [node.id]
  return [node.attr] if isinstance(node, ast.Attribute) else []


def _reads_a_checkpoint_object(node):
  """`x.restore(...)` on anything, `x.read(...)` on a tf.train.Checkpoint (its text names a checkpoint), and
  `x.preemption(...)` (an Execution's watcher, whose handler restores when made: restore_run makes it)."""
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
    return False
  receiver = ast.unparse(node.func.value).lower()
  return node.func.attr in ("restore", "preemption") or (
      node.func.attr == "read" and ("checkpoint" in receiver or "ckpt" in receiver))


def readers(source):
  """[(line, what)] of every checkpoint-reading call, import or name in Python `source`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    found += [(node.lineno, name) for name in _names(node) if name in READING]
    if _reads_a_checkpoint_object(node):
      found.append((node.lineno, f".{node.func.attr}()"))
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and INDEX_FIELD in node.value:
      found.append((node.lineno, INDEX_FIELD))
  return found


def test_nothing_but_the_owner_reads_checkpoints():
  wrong = []
  for path in product_files():
    if path in OWNER:
      continue
    found = readers(open(os.path.join(REPO, path)).read())
    wrong += [f"{path}:{line}: {what}" for line, what in found if (path, what) not in DECLARED]
  assert not wrong, "read checkpoints through loops/persist/checkpoints.Checkpoints:\n" + "\n".join(wrong)


def test_each_declared_reader_is_still_there():
  for path, what in DECLARED:
    assert what in {name for _, name in readers(open(os.path.join(REPO, path)).read())}, (path, what)


@pytest.mark.parametrize("planted", [
    "import tensorflow as tf\npath = tf.train.latest_checkpoint(d)",
    "import tensorflow as tf\nreader = tf.train.load_checkpoint(p)",
    "import tensorflow as tf\nnames = tf.train.list_variables(p)",
    "import tensorflow as tf\nr = tf.compat.v1.train.NewCheckpointReader(p)",
    "from tensorflow.train import latest_checkpoint as newest",
    "from tensorflow.python.checkpoint import checkpoint_management",
    "parts.checkpoint.restore(path).expect_partial()",
    "tf.train.Checkpoint(model=m).read(path)",
    "manager.restore_or_initialize()",
    "state = tf.train.get_checkpoint_state(d)",
    "model.load_weights(path)",
    "watcher = execution.preemption(checkpoints)",
    "from loops.persist import init_checkpoint",
    "found = re.search(r'model_checkpoint_path: \"(.*)\"', text)",
])
def test_a_planted_reader_is_caught(tmp_path, planted):
  planted_file = tmp_path / "planted.py"
  planted_file.write_text(f"import re\n\n\ndef f(d, p, path, parts, m, manager, model, execution, checkpoints, text):\n"
                          f"  {planted.replace(chr(10), chr(10) + '  ')}\n")
  assert readers(planted_file.read_text()), planted


def test_reading_files_and_saving_checkpoints_are_not_reading_checkpoints():
  clean = ("with open(p) as f:\n  text = f.read()\nblob = tf.io.gfile.GFile(p).read()\n"
           "path = manager.save(checkpoint_number=3)\ncheckpoints.save(step, wait=True)\n")
  assert readers(clean) == []


def test_the_sweep_reports_step_is_the_latest_in_an_index_tensorflow_wrote(tmp_path, monkeypatch):
  import tensorflow as tf
  from launch import sweep_report
  assert sweep_report.last_saved_step(str(tmp_path)) is None  # no index yet
  step = tf.Variable(0, dtype=tf.int64)
  monkeypatch.chdir(tmp_path)
  for workdir in ("relative", str(tmp_path / "absolute")):  # the index names them as the directory was given
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), os.path.join(workdir, "checkpoints"), 2)
    for number in (40, 120, 300):
      step.assign(number)
      manager.save(checkpoint_number=number)
    assert sweep_report.last_saved_step(workdir) == 300 == int(manager.latest_checkpoint.rsplit("-", 1)[1])
