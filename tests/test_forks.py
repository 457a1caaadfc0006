"""tests/fixtures/forks.py and its client tests/child_site/forked.py: a `python main.py` the tests start, forked from
main.py's imports, gives what a fresh process gives (output, exit code, its environment, PYTHONPATH, folder and CPU
affinity, its command line in /proc), ends when its stand-in is killed, and gets the signals its stand-in gets."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.child_site import forked
from tests.conftest import REPO, pythonpath, run_command, run_main

CPP_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ ", re.M)  # TensorFlow's C++ lines: time and thread id
BAD = ["--config=configs/digits_cnn.py", "--config.optimizer.name=adamm", "--workdir=/nonexistent/never"]
LONG = ["--config=configs/digits_cnn.py", "--config.train.steps=1000000", "--config.summary.progress_bar=off",
        "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0"]
IMPORTED_WITH = {name: os.environ.get(name) for name in forked.READ_AT_IMPORT}


def test_what_a_fork_cannot_show_runs_fresh():
  env = dict(os.environ)
  reason = lambda args, env=env, cwd=REPO: forked.fresh_reason(args, env, cwd, IMPORTED_WITH)  # noqa: E731
  assert reason(["main.py", "--config=c.py"]) is None
  assert reason([os.path.join(REPO, "main.py")], cwd="/") is None
  assert reason(["-m", "loops.worker_check", "dir", "1"]) is None
  assert reason(["-m", "data.prepare", "--config=c.py"]) is None
  assert reason(["main.py", "--debug"]) == "--debug acts at import"
  assert reason(["main.py"], {**env, "TF_CPP_MIN_LOG_LEVEL": "0"}) == "TF_CPP_MIN_LOG_LEVEL acts at import"
  assert reason(["main.py"], {**env, "KERAS_HOME": "/elsewhere"}) == "KERAS_HOME acts at import"
  assert reason(["main.py"], {**env, "SLURM_JOB_ID": "7"}).startswith("SLURM_JOB_ID: a process real SLURM")
  assert reason(["main.py"], {**env, "TESTS_FRESH_PROCESSES": "1"}) == "TESTS_FRESH_PROCESSES=1"
  for args, cwd in ((["-m", "launch.local"], REPO), (["main.py"], "/"), (["-u", "main.py"], REPO),
                    (["-m", "loops.worker_check"], "/")):
    assert reason(args, cwd=cwd).startswith("not main.py"), (args, cwd)


def test_the_signals_a_run_catches_reach_it():
  from loops.persist import preemption
  assert {signal.Signals[name] for name in preemption.CATCHABLE_SIGNALS} <= set(forked.RELAYED)


@pytest.mark.e2e
@pytest.mark.parametrize("args, last", [
    (["main.py", *BAD], "error: unknown optimizer 'adamm'"),
    # modules defining --config as main.py does: the server's own flags are not theirs
    (["-m", "data.prepare", "--config=configs/digits_cnn.py"], "FATAL Flags parsing error: flag --out=None: "),
    (["-m", "benchmarks.throughput", "--config=configs/digits_cnn.py", "--config.train.stepz=3"],
     "error: unknown config key 'train.stepz' in --config.train.stepz=3 (did you mean 'train.steps'?)"),
])
def test_a_forked_run_says_what_a_fresh_process_says(args, last):
  command = [sys.executable, *args]
  forked_run = run_command(command)
  fresh = run_command(command, env={**os.environ, "TESTS_FRESH_PROCESSES": "1"})
  said = [(done.returncode, done.stdout, CPP_LOG_PREFIX.sub("", done.stderr)) for done in (forked_run, fresh)]
  assert said[0] == said[1]
  assert forked_run.returncode == 1 and forked_run.stderr.splitlines()[-2 if "FATAL" in last else -1].startswith(
      last), forked_run.stderr[-1000:]


@pytest.mark.e2e
def test_the_child_sees_its_own_environment_python_path_and_merged_output(tmp_path):
  (tmp_path / "my_plugins.py").write_text("import os\nVALUE = os.environ['MY_SETTING']\n")
  done = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'w'}", "--dry_run",
                  "--config.loss.name=my_plugins:nothing",
                  env={"PYTHONPATH": pythonpath(str(tmp_path)), "MY_SETTING": "x"})
  assert done.stderr.strip().splitlines()[-1].startswith(
      "error: module 'my_plugins' has no 'nothing' (loss.name='my_plugins:nothing')"), done.stderr
  merged = run_command([sys.executable, "main.py", *BAD], merge_output=True)
  assert merged.stderr is None and merged.stdout.splitlines()[-1].startswith("error: unknown optimizer 'adamm'")
  assert "MY_SETTING" not in os.environ


def runs_of(workdir):
  """The pids whose command line names `workdir`: the stand-in and the forked run."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if f"--workdir={workdir}".encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


def cpus_allowed(pid):
  with open(f"/proc/{pid}/status") as f:
    return next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list"))


def started(workdir, proc):
  """The forked run of `proc` (a stand-in started with --workdir=workdir), once it is there."""
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    others = [pid for pid in runs_of(workdir) if pid != proc.pid]
    if others:
      return others[0]
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.05)
  raise AssertionError("no forked run within 60 s")


@pytest.mark.e2e
def test_a_killed_stand_in_takes_its_run_down_and_signals_reach_the_run(tmp_path):
  from launch import local
  from tests.conftest import fork_server
  fork_server.start()
  workdir = str(tmp_path / "w")
  on_cpu_0 = local.dying_with_this_process(signal.SIGKILL, lambda: os.sched_setaffinity(0, {0}))
  proc = subprocess.Popen([sys.executable, "main.py", *LONG, f"--workdir={workdir}"], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=on_cpu_0)
  run = started(workdir, proc)
  assert cpus_allowed(run) == "0"  # the stand-in's affinity
  proc.kill()
  proc.wait()
  deadline = time.monotonic() + 10
  while runs_of(workdir) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not runs_of(workdir)

  proc = subprocess.Popen([sys.executable, "main.py", *LONG, f"--workdir={workdir}2"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  run = started(f"{workdir}2", proc)
  for line in proc.stdout:
    if re.search(r"step \d+/", line):  # training: the preemption handler set
      break
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 143, out[-3000:]  # main.py's exit after a SIGTERM it saved for
  assert not os.path.exists(f"/proc/{run}")


@pytest.mark.e2e
def test_a_run_past_its_timeout_is_killed_and_the_next_run_goes_on():
  with pytest.raises(subprocess.TimeoutExpired):
    run_main("--config=configs/digits_cnn.py", "--workdir=ram://forever", "--config.train.steps=1000000",
             timeout=3)
  assert run_command([sys.executable, "main.py", *BAD]).returncode == 1


@pytest.mark.e2e
def test_a_ctrl_c_before_the_run_started_ends_the_stand_in_as_python_ends_on_it(tmp_path):
  from tests.conftest import ctrl_c_reaches_it
  fake = tmp_path / "socket"  # a server that takes the request and never answers
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(str(fake))
  listener.listen()
  proc = subprocess.Popen([sys.executable, "main.py", *BAD], cwd=REPO, env={**os.environ, forked.SERVER: str(fake)},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
  connection, _ = listener.accept()
  connection.recv(forked.MESSAGE_BYTES)  # the request came: the stand-in waits for the answer
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=60)
  connection.close()
  listener.close()
  assert proc.returncode == -signal.SIGINT, err  # not a fresh run going on (it would exit 1: adamm)
  assert "error:" not in err
