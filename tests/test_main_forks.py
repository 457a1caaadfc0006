"""tests/fixtures/main_forks.py, through conftest.run_command: a `python main.py` forked from main.py's imports gives
what a fresh process gives (output, exit code, the environment and PYTHONPATH it was given), and a timeout ends it."""

import os
import re
import subprocess
import sys

import pytest

from tests import conftest
from tests.conftest import REPO, run_command, run_main

pytestmark = pytest.mark.e2e  # starts processes (pytest.ini)

CPP_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ ", re.M)  # TensorFlow's C++ lines: time and thread id
BAD = ["--config=configs/digits_cnn.py", "--config.optimizer.name=adamm", "--workdir=/nonexistent/never"]


def test_a_forked_run_says_what_a_fresh_process_says():
  command = [sys.executable, "main.py", *BAD]
  assert conftest._forkable(command, dict(os.environ), REPO)  # pylint: disable=protected-access
  forked = run_command(command)
  fresh = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
  said = [(done.returncode, done.stdout, CPP_LOG_PREFIX.sub("", done.stderr)) for done in (forked, fresh)]
  assert said[0] == said[1]
  assert forked.returncode == 1 and forked.stderr.splitlines()[-1].startswith("error: unknown optimizer 'adamm'")


def test_the_child_sees_its_own_environment_python_path_and_merged_output(tmp_path):
  (tmp_path / "my_plugins.py").write_text("import os\nVALUE = os.environ['MY_SETTING']\n")
  done = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'w'}", "--dry_run",
                  "--config.loss.name=my_plugins:nothing", env={"PYTHONPATH": str(tmp_path), "MY_SETTING": "x"})
  assert done.stderr.strip().splitlines()[-1].startswith(
      "error: module 'my_plugins' has no 'nothing' (loss.name='my_plugins:nothing')"), done.stderr
  merged = run_command([sys.executable, "main.py", *BAD], merge_output=True)
  assert merged.stderr is None and merged.stdout.splitlines()[-1].startswith("error: unknown optimizer 'adamm'")
  assert "MY_SETTING" not in os.environ


def test_a_run_past_its_timeout_is_killed_and_the_next_run_goes_on():
  with pytest.raises(subprocess.TimeoutExpired):
    run_main("--config=configs/digits_cnn.py", "--workdir=ram://forever", "--config.train.steps=1000000",
             timeout=3)
  assert run_command([sys.executable, "main.py", *BAD]).returncode == 1


def test_what_acts_at_import_runs_in_a_fresh_process():
  forkable = conftest._forkable  # pylint: disable=protected-access
  environment = dict(os.environ)
  assert not forkable([sys.executable, "main.py", "--debug"], environment, REPO)
  assert not forkable([sys.executable, "main.py"], {**environment, "TF_CPP_MIN_LOG_LEVEL": "0"}, REPO)
  assert not forkable([sys.executable, "main.py"], {**environment, "KERAS_HOME": "/elsewhere"}, REPO)
  assert not forkable([sys.executable, "-m", "launch.local"], environment, REPO)
  assert not forkable([sys.executable, "main.py"], environment, "/")  # another folder's main.py
