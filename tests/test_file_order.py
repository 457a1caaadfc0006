"""The suite's order: longest test files first, each file's tests kept together and in their order."""

import collections
import json
import os

from tests import file_order
from tests.conftest import REPO

Item = collections.namedtuple("Item", "nodeid")


def test_longest_files_first_unmeasured_before_them_and_each_file_kept_in_order():
  items = [Item(n) for n in ("tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/new.py::x", "tests/c.py::x",
                             "tests/b.py::y")]
  file_order.longest_first(items, {"tests/a.py": 5.0, "tests/b.py": 90.0, "tests/c.py": 20.0})
  assert [i.nodeid for i in items] == ["tests/new.py::x", "tests/b.py::x", "tests/b.py::y", "tests/c.py::x",
                                       "tests/a.py::x", "tests/a.py::y"]


def test_recorder_sums_setup_call_and_teardown_per_file(tmp_path):
  path = str(tmp_path / "durations.json")
  recorder = file_order.Recorder(path)
  for nodeid, seconds in (("tests/a.py::x", 1.25), ("tests/a.py::x", 2.0), ("tests/b.py::y[1]", 0.5)):
    recorder.add(nodeid, seconds)
  recorder.write()
  assert file_order.load(path) == {"tests/a.py": 3.2, "tests/b.py": 0.5}
  assert file_order.load(str(tmp_path / "missing.json")) == {}


def test_the_recorded_durations_name_only_test_files_that_exist():
  with open(file_order.DURATIONS) as f:
    recorded = json.load(f)
  missing = [name for name in recorded if not os.path.isfile(os.path.join(REPO, name))]
  assert not missing, f"tests/file_durations.json names removed files {missing}: rerun with --record-file-durations"
