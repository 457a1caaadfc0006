"""tests/child_site/process_log.py: the processes the tests start, logged with their CPU (TESTS_PROCESS_LOG)."""

import json
import os
import sys

import pytest

from tests.conftest import CHILD_SITE, run_command

sys.path.insert(0, CHILD_SITE)
import process_log  # noqa: E402  # pylint: disable=wrong-import-position


def test_the_summary_counts_each_kind_and_ranks_tests_by_their_processes_cpu():
  lines = [{"kind": "forked", "cpu": 1.5, "test": "tests/test_a.py::one (call)"},
           {"kind": "forked", "cpu": 0.5, "test": "tests/test_b.py::two (call)"},
           {"kind": "fresh", "tensorflow": True, "cpu": 4.0, "test": "tests/test_b.py::two (call)"},
           {"kind": "fresh", "tensorflow": False, "cpu": 0.25, "test": ""}]
  assert process_log.summary(lines).splitlines() == [
      "forked: 2 processes, 2.0 s of CPU", "fresh: 1 processes, 0.2 s of CPU",
      "fresh (TensorFlow): 1 processes, 4.0 s of CPU", "      4.5 s  tests/test_b.py::two",
      "      1.5 s  tests/test_a.py::one", "      0.2 s  (no test: started outside one)"]


@pytest.mark.e2e
def test_a_forked_run_and_a_fresh_process_each_leave_their_line(tmp_path):
  log = tmp_path / "processes.jsonl"
  env = {**os.environ, process_log.VARIABLE: str(log)}
  forked_run = run_command([sys.executable, "main.py", "--config=configs/digits_cnn.py", "--config.optimizer.name=x"],
                           env=env)
  fresh = run_command([sys.executable, "-c", "sum(range(10 ** 6))"], env=env)
  assert forked_run.returncode == 1 and fresh.returncode == 0
  lines = {line["kind"]: line for line in map(json.loads, log.read_text().splitlines())}
  assert sorted(lines) == ["forked", "fresh"], lines
  assert lines["forked"]["argv"][:2] == ["main.py", "--config=configs/digits_cnn.py"]
  assert lines["fresh"]["argv"] == ["-c", "sum(range(10 ** 6))"] and lines["fresh"]["tensorflow"] is False
  for line in lines.values():
    assert line["test"].startswith("tests/test_process_log.py::test_a_forked_run_and_a_fresh_process_each_leave")
    assert 0 < line["cpu"] < 60 and line["wall"] > 0
