"""Paths as users type them: README's quickstart verbatim from a fresh copy of the repository (twice), and resume
on relative workdirs, workdirs with `..`, through a symlink and on a URL, from the directory the command runs in."""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from loops import run
from tests.conftest import REPO

README_QUICKSTART = ".venv/bin/python main.py --config=configs/digits_cnn.py --workdir=runs/digits"


def fresh_copy(destination):
  """The repository's files as a clone has them (tracked and new, not ignored) copied to `destination`, with
  `.venv` linked to this interpreter's environment (installing it is .ci/run's job, not each test's)."""
  listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                          capture_output=True, check=True).stdout.decode().split("\0")
  for name in filter(None, listed):
    if os.path.isfile(os.path.join(REPO, name)):
      os.makedirs(os.path.join(destination, os.path.dirname(name)), exist_ok=True)
      shutil.copy2(os.path.join(REPO, name), os.path.join(destination, name))
  os.symlink(sys.prefix, os.path.join(destination, ".venv"))
  return destination


def readme_commands():
  """README's first command (install and train), split at `&&`, without its install steps."""
  text = open(os.path.join(REPO, "README.md")).read()
  first = next(line.strip() for line in text.splitlines() if line.strip().startswith("python3 -m venv"))
  return [part.strip() for part in first.split("&&")
          if not part.strip().startswith(("python3 -m venv", ".venv/bin/pip install"))]


@pytest.mark.e2e
def test_readme_quickstart_run_twice_from_a_fresh_copy_resumes_instead_of_failing(tmp_path):
  assert readme_commands() == [README_QUICKSTART]
  clone = fresh_copy(str(tmp_path / "clone"))
  shell_env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
  first = subprocess.run(README_QUICKSTART, shell=True, cwd=clone, env=shell_env, capture_output=True, text=True,
                         timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "done: step=1100" in first.stderr
  second = subprocess.run(README_QUICKSTART, shell=True, cwd=clone, env=shell_env, capture_output=True, text=True,
                          timeout=600)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "restored runs/digits/checkpoints/ckpt-1100" in second.stderr
  assert "unreadable" not in second.stderr and "\nerror: " not in second.stderr
  assert "step 1100 of 1100 already done" in second.stderr


class StartStep:
  """A callback that records the step each run starts (or resumes) at."""

  def __init__(self):
    self.steps = []

  def on_train_begin(self, state):
    self.steps.append(state.step)


def two_parts(config, workdir, steps=(10, 20)):
  """Trains `config` to steps[0], then reruns the same workdir to steps[1]; returns the steps each part began at."""
  starts = StartStep()
  for total in steps:
    config.train.steps = total
    summary = run.train_and_evaluate(config, workdir, callbacks=[starts])
    assert summary["step"] == total
  return starts.steps


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["relative", "dot_dot", "symlink", "url"])
def test_a_rerun_resumes_on_every_kind_of_workdir_path(kind, tiny_digits, tmp_path, monkeypatch):
  tiny_digits.checkpoint.every_steps = 10
  (tmp_path / "here").mkdir()
  monkeypatch.chdir(tmp_path / "here")
  if kind == "symlink":
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "here" / "link")
  workdir = {"relative": "runs/r", "dot_dot": "../here/runs/r", "symlink": "link/r",
             "url": f"ram://{tmp_path.name}/r"}[kind]
  assert two_parts(tiny_digits, workdir) == [0, 10]
  if kind == "symlink":
    assert (tmp_path / "real" / "r" / "checkpoints" / "ckpt-20.index").exists()


@pytest.mark.e2e
def test_a_damaged_latest_checkpoint_set_aside_on_a_relative_workdir_leaves_an_index_the_next_rerun_reads(
    tiny_digits, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  tiny_digits.checkpoint.every_steps = 10
  two_parts(tiny_digits, "runs/r")
  data = next(p for p in (tmp_path / "runs" / "r" / "checkpoints").iterdir()
              if re.match(r"ckpt-20\.data", p.name))
  content = bytearray(data.read_bytes())
  content[len(content) // 2] ^= 0xFF
  data.write_bytes(bytes(content))
  assert two_parts(tiny_digits, "runs/r", steps=(20, 30)) == [10, 20]  # set aside, resumed at 10; then at 20
  index = (tmp_path / "runs" / "r" / "checkpoints" / "checkpoint").read_text()
  assert "runs/r" not in index and 'model_checkpoint_path: "ckpt-30"' in index, index


def test_fresh_copy_has_the_files_a_user_runs(tmp_path):
  clone = fresh_copy(str(tmp_path / "c"))
  for name in ("main.py", "README.md", "configs/digits_cnn.py", "requirements.txt", ".ci/run"):
    assert os.path.isfile(os.path.join(clone, name)), name
  assert shlex.split(README_QUICKSTART)[0] == ".venv/bin/python"
  assert os.path.samefile(os.path.join(clone, ".venv", "bin", "python"), os.path.join(sys.prefix, "bin", "python"))


@pytest.mark.e2e
@pytest.mark.parametrize("command, said", [
    (["main.py", "--config=configs/digits_cnn.py", "--workdir=WORK"],
     "interrupted (Ctrl-C) while starting: nothing was trained or saved"),
    (["-m", "launch.sweep", "--config=configs/digits_cnn.py", "--sweep_dir=WORK", "--grid",
      "optimizer.learning_rate=0.1,0.2"],  # during the first trial's --dry_run
     "interrupted (Ctrl-C): no trial was running; the same command goes on from here"),
])
def test_ctrl_c_while_a_command_starts_is_one_line(command, said, tmp_path):
  """Ctrl-C 1 s in, during TensorFlow's imports (a fresh process, as a user's is: the tests' forked runs skip them)
  or the sweep's first check: one line, exit 130, no traceback, no training."""
  import signal
  import time
  from tests.conftest import ctrl_c_reaches_it
  work = str(tmp_path / "work")
  process = subprocess.Popen([sys.executable, *[a.replace("WORK", work) for a in command]], cwd=REPO,
                             env={**os.environ, "TESTS_FRESH_PROCESSES": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
  time.sleep(1.0)
  process.send_signal(signal.SIGINT)
  errors = process.communicate(timeout=120)[1]
  assert process.returncode == 130, errors[-2000:]
  assert errors.strip().splitlines()[-1] == said and "Traceback" not in errors, errors[-2000:]
  assert not os.path.exists(os.path.join(work, "checkpoints"))
