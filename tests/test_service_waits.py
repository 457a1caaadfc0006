"""Every wait for the tf.data service is bounded and ends on a signal (issue 35, point 1), tried as a user meets it:
real main.py processes, a real unreachable port, real data-service processes killed with -9, a real SIGTERM.
Each ends with one `error:` line naming what it waited for and the preemption exit code (143: rerun to resume).
TensorFlow alone waits for all of these forever, deaf to SIGTERM."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from launch import local
from loops import rules
from errors import ConfigError
from tests.conftest import REPO, load_config

PREEMPTED = 143
BOUND = 240  # far more than any case takes; a hang fails the test instead of blocking the suite


def main_py(workdir, service, *extra):
  command = [sys.executable, "main.py", "--config=configs/digits_cnn.py", f"--workdir={workdir}",
             f"--config.data.service={service}", "--config.summary.progress_bar=off", *extra]
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc, text):
  """The output up to and including the first line containing `text` (fails if the process ends first)."""
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if text in line:
      return "".join(lines)
  pytest.fail(f"the run ended before printing {text!r}:\n{''.join(lines)[-3000:]}")


def finish(proc):
  try:
    rest, _ = proc.communicate(timeout=BOUND)
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail("the run still waited on the tf.data service")
  return rest


def error_lines(output):
  return [line for line in output.splitlines() if line.startswith("error:")]


def test_the_timeout_must_be_positive():
  config = load_config("digits_cnn")
  config.data.service, config.data.service_timeout_seconds = "grpc://127.0.0.1:5050", 0
  with pytest.raises(ConfigError, match="data.service_timeout_seconds must be a number of seconds > 0"):
    rules.check(config)


@pytest.mark.e2e
def test_an_unreachable_dispatcher_ends_the_run_on_sigterm(tmp_path):
  address = f"grpc://127.0.0.1:{local.free_ports(1)[0]}"  # nothing listens there
  proc = main_py(tmp_path / "run", address, "--config.train.steps=100")
  read_until(proc, "train input through the tf.data service")
  proc.send_signal(signal.SIGTERM)
  rest = finish(proc)
  assert proc.returncode == PREEMPTED, rest[-3000:]
  assert error_lines(rest) == [
      f"error: the tf.data service dispatcher at {address} does not answer (SIGTERM while waiting for it): nothing "
      "listens there; start it (python -m data.service dispatcher --port=PORT, or python -m launch.local "
      "--data_workers K) or fix data.service"], rest[-3000:]
  assert "Traceback" not in rest


@pytest.mark.e2e
def test_an_unreachable_dispatcher_ends_the_run_after_the_timeout(tmp_path):
  address = f"grpc://127.0.0.1:{local.free_ports(1)[0]}"
  proc = main_py(tmp_path / "run", address, "--config.train.steps=100", "--config.data.service_timeout_seconds=2")
  rest = finish(proc)
  assert proc.returncode == PREEMPTED, rest[-3000:]
  assert len(error_lines(rest)) == 1 and "(waited data.service_timeout_seconds=2)" in error_lines(rest)[0], rest
  assert "Traceback" not in rest


@pytest.fixture
def one_data_worker():
  address, procs = local.start_data_service(1, sys.stdout, threading.Lock())
  yield address, procs["data:worker:0"]
  for proc in procs.values():
    local._stop(proc)


@pytest.mark.e2e
@pytest.mark.parametrize("sigterm", [False, True], ids=["timeout", "sigterm"])
def test_a_data_worker_killed_mid_run_ends_the_run(one_data_worker, tmp_path, sigterm):
  """No batch after the kill: past data.service_timeout_seconds (8 s), or once a SIGTERM finds the input stuck
  (the timeout is 600 s there, so only the signal can end it)."""
  address, worker = one_data_worker
  timeout = 600 if sigterm else 8
  proc = main_py(tmp_path / "run", address, "--config.train.steps=100000", "--config.train.steps_per_loop=50",
                 f"--config.data.service_timeout_seconds={timeout}")
  read_until(proc, "step 100/")
  worker.kill()
  if sigterm:
    time.sleep(3)  # into the next call, whose input is stuck (a signal at a call's end saves: the other test)
    proc.send_signal(signal.SIGTERM)
  rest = finish(proc)
  assert proc.returncode == PREEMPTED, rest[-3000:]
  if sigterm and "preempted (SIGTERM): checkpoint saved" in rest:  # the call still ended on buffered batches
    assert not error_lines(rest) and "Traceback" not in rest, rest[-3000:]
    return
  lines = error_lines(rest)
  assert len(lines) == 1 and "Traceback" not in rest, rest[-3000:]
  waited = f"SIGTERM while the train input waited" if sigterm else "no batch from the tf.data service at"
  assert lines[0].startswith(f"error: {waited}") and address in lines[0], lines
  assert lines[0].endswith("the dispatcher answers but sends no batches (a data worker lost, or none registered); "
                           "exiting with code 143 without a save: rerun to resume from the last checkpoint"), lines


@pytest.mark.e2e
def test_launch_local_ends_the_job_when_its_data_worker_is_killed(tmp_path):
  command = [sys.executable, "-m", "launch.local", "--workers=1", "--data_workers=1", "--", sys.executable,
             "main.py", "--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'run'}",
             "--config.train.steps=100000", "--config.summary.progress_bar=off"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  started = read_until(proc, "step 100/")
  pid = int(started.split("[launch] data:worker:0 started (pid ")[1].split(")")[0])
  os.kill(pid, signal.SIGKILL)
  rest = finish(proc)
  assert proc.returncode == PREEMPTED, rest[-3000:]
  assert rest.strip().splitlines()[-1] == (
      "[launch] data:worker:0 died of signal 9 (SIGKILL): the tf.data service lost a process; stopped the "
      "other processes; exit code 143: rerun to resume from the last checkpoint")


@pytest.mark.e2e
def test_a_sigterm_with_the_service_answering_still_saves_and_resumes(one_data_worker, tmp_path):
  """The watch ends only a stuck input: with batches arriving, the call ends and the run saves as always."""
  address, _ = one_data_worker
  proc = main_py(tmp_path / "run", address, "--config.train.steps=100000", "--config.train.steps_per_loop=50")
  read_until(proc, "step 100/")
  proc.send_signal(signal.SIGTERM)
  rest = finish(proc)
  assert proc.returncode == PREEMPTED, rest[-3000:]
  assert "preempted (SIGTERM): checkpoint saved; exiting with code 143" in rest and not error_lines(rest), rest
  assert list((tmp_path / "run" / "checkpoints").glob("ckpt-*.index"))


@pytest.mark.e2e
def test_a_dry_run_says_whether_the_dispatcher_answers(one_data_worker, tmp_path):
  from loops import run
  from data import service as service_lib
  address, _ = one_data_worker
  service_lib.wait_for_dispatcher(address, 120)  # its process has just started
  unreachable = f"grpc://127.0.0.1:{local.free_ports(1)[0]}"
  for service, said in ((address, f"{address} answers"), (unreachable, f"{unreachable} does not answer now (a run "
                                                          "waits data.service_timeout_seconds=120 for it)")):
    config = load_config("digits_cnn")
    config.data.service = service
    assert run.train_and_evaluate(config, str(tmp_path / "dry"), dry_run=True)["data_service"] == said


@pytest.mark.e2e
def test_a_signal_that_came_between_calls_ends_the_next_calls_stuck_wait(monkeypatch):
  """SIGTERM after one call's end and before the next call's watch began (where the kill test's signal may land)."""
  import time
  from data import service
  from loops.distribute import service_watch
  from loops.persist import preemption
  ended = []
  monkeypatch.setattr(service_watch.ServiceWatch, "_end", lambda watch, what, code=None: ended.append(what))
  monkeypatch.setattr(service_watch, "SIGNAL_GRACE_SECONDS", 0.3)
  monkeypatch.setattr(preemption, "RECEIVED", ["SIGTERM"])
  monkeypatch.setattr(service.ARRIVALS, "longest_gap", 0.0)
  with service_watch.ServiceWatch("grpc://127.0.0.1:1", 600, 143, poll_seconds=0.05):
    time.sleep(1.0)  # no batch arrives: the input is stuck
  assert ended and ended[0].startswith("SIGTERM while the train input waited"), ended
  monkeypatch.setattr(preemption, "RECEIVED", [])
  ended.clear()
  with service_watch.ServiceWatch("grpc://127.0.0.1:1", 600, 143, poll_seconds=0.05):
    time.sleep(1.0)
  assert not ended  # no signal: only data.service_timeout_seconds (600 s) would end it
