"""Issue 41: a sweep survives what users do to it. A TPE search reruns after a failed trial (a user callback in a
module outside the repository); kill -9 of a sweep takes its trial down with it, and the rerun takes over the lock
and waits for a run still alive instead of failing it; two sweeps on one directory: the second is refused in one
line; after an interrupted rerun with changed flags the report shows each trial by its current settings only."""

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from launch import local
from launch import sweep_study
from loops.callbacks import sweep_trial
from tests.conftest import REPO, ctrl_c_reaches_it, pythonpath

SPACE = ["--grid", "optimizer.learning_rate=loguniform:1e-3:1e-1"]
SHORT = ["--config.train.steps=20", "--config.train.steps_per_loop=10", "--config.export=False"]
USER_MODULE = '''
import os


class _RaisesOnce:
  def on_train_begin(self, state):
    marker = os.environ["FLAKY_MARKER"]
    if os.path.exists(marker):
      os.remove(marker)
      raise RuntimeError("the user's callback fails once")


def raises_once(config):
  return _RaisesOnce()
'''


def command(sweep_dir, *args):
  return [sys.executable, "-m", "launch.sweep", "--config=configs/digits_cnn.py", f"--sweep_dir={sweep_dir}", *args]


def sweep(sweep_dir, *args, env=None):
  """python -m launch.sweep ... as a user runs it; the CompletedProcess."""
  return subprocess.run(command(sweep_dir, *args), cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, **(env or {})})


def study_trials(sweep_dir):
  return sweep_trial.load_study(os.path.join(sweep_dir, sweep_study.STUDY_FILE)).get_trials()


def report_rows(sweep_dir):
  with open(os.path.join(sweep_dir, "report.csv")) as f:
    return {row["trial"]: row for row in csv.DictReader(f)}


def wait_for(condition, seconds, what):
  deadline = time.monotonic() + seconds
  while not condition():
    assert time.monotonic() < deadline, f"no {what} within {seconds} s"
    time.sleep(0.1)


def alive(pid):
  """Process `pid` runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def trains(workdir, total_steps, attempt=1):
  """The trial's `attempt`-th attempt has logged a train step of `total_steps` (its preemption handler is set)."""
  try:
    with open(os.path.join(workdir, "sweep.log")) as f:
      text = f.read()
  except OSError:  # not a trial (yet)
    return False
  parts = text.split("=== sweep ")
  return len(parts) > attempt and re.search(rf"\] step \d+/{total_steps} ", parts[attempt]) is not None


def training_trial(sweep_dir, total_steps):
  """The workdir of a trial that is training (a train step logged), or None."""
  names = [n for n in (os.listdir(sweep_dir) if os.path.isdir(sweep_dir) else [])
           if trains(os.path.join(sweep_dir, n), total_steps)]
  return os.path.join(sweep_dir, names[0]) if names else None


def last_attempt(workdir):
  with open(os.path.join(workdir, "sweep.json")) as f:
    return json.load(f)["attempts"][-1]


@pytest.mark.e2e
def test_a_tpe_search_reruns_after_a_failed_trial(tmp_path):
  """The rerun asked the failed trial's values again with another kind of distribution: Optuna refused it (a
  traceback on every rerun) and the study kept a RUNNING trial without parameters."""
  user = tmp_path / "user"
  user.mkdir()
  (user / "flaky.py").write_text(USER_MODULE)
  (tmp_path / "marker").touch()
  env = {"PYTHONPATH": pythonpath(str(user)),
         "FLAKY_MARKER": str(tmp_path / "marker")}
  args = [*SPACE, "--search=tpe", "--trials", "1", "--", *SHORT, "--config.callbacks=('flaky:raises_once',)"]
  first = sweep(tmp_path / "tpe", *args, env=env)
  assert first.returncode == 1 and first.stdout.count(": failed: ") == 1, first.stdout + first.stderr
  again = sweep(tmp_path / "tpe", *args, env=env)
  assert again.returncode == 0 and "Traceback" not in again.stderr, again.stdout + again.stderr
  assert "1 trials: 1 complete" in again.stdout
  failed, redone = study_trials(tmp_path / "tpe")  # no third trial: none left RUNNING without parameters
  assert (failed.state.name, redone.state.name) == ("FAIL", "COMPLETE")
  assert redone.params == failed.params and redone.distributions == failed.distributions
  assert redone.user_attrs == failed.user_attrs  # the same sweep trial: index, name, overrides


@pytest.mark.e2e
def test_a_killed_sweep_takes_its_trial_down_and_the_rerun_waits_for_a_live_run(tmp_path):
  """kill -9 of the sweep left its trial training: the rerun's attempt was refused (workdir in use), told FAIL, and
  the orphan died at its next eval reporting to the finished Optuna trial."""
  sweep_dir = str(tmp_path / "killed")
  args = [*SPACE, "--search=tpe", "--trials", "1", "--", "--config.train.steps=60",
          "--config.train.steps_per_loop=10", "--config.export=False"]
  proc = subprocess.Popen(command(sweep_dir, *args), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wait_for(lambda: training_trial(sweep_dir, 60), 120, "trial training")
  workdir = training_trial(sweep_dir, 60)
  trial_pid = last_attempt(workdir)["pid"]
  proc.kill()  # kill -9: nothing of the sweep's own runs
  proc.wait()
  wait_for(lambda: not alive(trial_pid), 60, "end of the orphaned trial")
  with open(os.path.join(workdir, "sweep.log")) as f:
    assert "preempted (SIGTERM): checkpoint saved" in f.read()  # the parent-death signal: saved, not trained on
  # A run of that trial still alive (a stand-in: a process naming the workdir, holding its lock) is waited for.
  stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)", f"--workdir={workdir}"])
  threading.Thread(target=stand_in.wait, daemon=True).start()  # reaped at once: no zombie holding the lock
  with open(os.path.join(workdir, "run.lock"), "w") as f:
    json.dump({"host": socket.gethostname(), "pid": stand_in.pid, "since": time.time(), "heartbeat": time.time()}, f)
  again = sweep(sweep_dir, *args)
  assert again.returncode == 0, again.stdout + again.stderr
  assert f"from a sweep that is gone (pid {proc.pid} " in again.stdout  # the stale sweep lock taken over
  name = os.path.basename(workdir)
  assert f"{name}: its earlier run (pid {stand_in.pid}) is still running; waiting for it to end" in again.stdout
  assert again.stdout.index(f"{name}: its earlier run ended") < again.stdout.index(f"start {name} ")
  assert [t.state.name for t in study_trials(sweep_dir)] == ["COMPLETE"]  # not told FAIL, asked once
  assert "1 trials: 1 complete" in again.stdout


@pytest.mark.e2e
def test_a_second_sweep_on_the_directory_is_refused_in_one_line(tmp_path):
  """Two TPE sweeps on one directory crashed every trial and left it unresumable."""
  sweep_dir = str(tmp_path / "twice")
  args = [*SPACE, "--search=tpe", "--trials", "1", "--", *SHORT]
  procs = [subprocess.Popen(command(sweep_dir, *args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(2)]
  outputs = [p.communicate(timeout=300) for p in procs]
  codes = sorted(p.returncode for p in procs)
  assert codes == [0, 1], outputs
  winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
  lines = outputs[loser][1].strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: sweep directory {sweep_dir} is in use by another sweep "
                                                 f"(pid {procs[winner].pid} on host "), lines
  assert "1 trials: 1 complete" in outputs[winner][0]
  again = sweep(sweep_dir, *args)  # resumable: the winner's trial is complete
  assert again.returncode == 0 and "1 complete (skipped), 0 to run" in again.stdout, again.stdout + again.stderr
  assert not os.path.exists(os.path.join(sweep_dir, "sweep.lock"))


@pytest.mark.e2e
def test_the_report_shows_each_trial_by_its_current_settings_only(tmp_path):
  """After an interrupted rerun with changed flags the report showed a trial that had not run with them as failed
  with an older attempt's error, and more steps spent than the full length (a stale summary's total_steps)."""
  sweep_dir = str(tmp_path / "changed")
  grid = ["--grid", "optimizer.learning_rate=0.1,-1"]
  first = sweep(sweep_dir, *grid, "--", *SHORT)
  assert first.returncode == 1 and "learning_rate=-1: failed: error: " in first.stdout, first.stdout + first.stderr
  longer = ["--config.train.steps=2000", "--config.train.steps_per_loop=10", "--config.export=False"]
  proc = subprocess.Popen(command(sweep_dir, *grid, "--", *longer), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_reaches_it)
  workdir = os.path.join(sweep_dir, "learning_rate=0.1")
  wait_for(lambda: trains(workdir, 2000, attempt=2), 120, "learning_rate=0.1 training again")
  proc.send_signal(signal.SIGINT)
  out = proc.communicate(timeout=120)[0]
  assert proc.returncode == 143, out
  rows = report_rows(sweep_dir)
  assert rows["learning_rate=-1"]["status"] == "pending" and rows["learning_rate=-1"]["error"] == "", out
  assert rows["learning_rate=-1"]["step"] == "" and rows["learning_rate=-1"]["wall_seconds"] == "0"
  assert rows["learning_rate=0.1"]["status"] in ("unfinished", "complete"), rows
  step = int(rows["learning_rate=0.1"]["step"] or 20)
  # the trial that resumed from step 20 has 1980 steps to train with these settings, the pending one 2000
  assert f"steps spent {step - 20} of 3980 for 2 full-length trials" in out, out


def test_a_trial_dies_with_its_parent_however_the_parent_ends(tmp_path):
  """launch.local.dying_with_this_process (used for every sweep trial): kill -9 of the parent ends the child."""
  script = textwrap.dedent(f"""
      import signal, subprocess, sys, time
      from launch import local
      child = subprocess.Popen(["sleep", "60"], preexec_fn=local.dying_with_this_process(signal.SIGTERM))
      open({str(tmp_path / "child")!r}, "w").write(str(child.pid))
      time.sleep(60)""")
  parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
  wait_for(lambda: os.path.exists(tmp_path / "child") and (tmp_path / "child").read_text(), 30, "child")
  child = int((tmp_path / "child").read_text())
  parent.kill()
  parent.wait()
  wait_for(lambda: not alive(child), 10, "end of the child")


def test_every_trial_of_a_study_gets_the_same_distribution_per_key(tmp_path):
  """Fixed grid points were asked with one-value categoricals (Optuna refused the second point with --prune), a
  failed trial again with another kind of distribution; values the study refuses leave no RUNNING trial."""
  from launch import sweep_grid

  record = {"space": {"lr": "0.1,0.5"}, "metric": "eval/accuracy", "mode": "max", "search": "grid", "prune": "asha",
            "seed": 0, "trials": 2}
  study = sweep_study.open_study(str(tmp_path / "study.log"), record)
  grid = sweep_grid.parse_grid(["lr=0.1,0.5"])
  assert [sweep_study.assign(study, str(tmp_path), i, grid, {"lr": v})["overrides"] for i, v in
          enumerate(["0.1", "0.5"])] == [{"lr": "0.1"}, {"lr": "0.5"}]
  sweep_study.fail(study, 1)
  assert sweep_study.assign(study, str(tmp_path), 1, None)["number"] == 2
  assert {t.number: t.params["lr"] for t in study.get_trials()} == {0: "0.1", 1: "0.5", 2: "0.5"}
  assert len({repr(t.distributions["lr"]) for t in study.get_trials()}) == 1
  other = sweep_grid.parse_grid(["lr=loguniform:1e-3:1"])  # a float where the study has categoricals
  with pytest.raises(sweep_grid.SweepError, match=r"^the sweep's study refuses trial 3's values \(Optuna: [^\n]*$"):
    sweep_study.assign(study, str(tmp_path), 3, other)
  assert study.get_trials()[-1].state.name == "FAIL" and not study.get_trials()[-1].params
