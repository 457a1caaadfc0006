"""loops/persist/workdir_lock.py: one run per workdir (the chief's lock), stale locks taken over, two real processes."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from errors import ConfigError
from loops.persist import workdir_lock
from tests.conftest import REPO, run_command

PY = sys.executable


class Clock:
  def __init__(self, now=1_800_000_000.0):
    self.now = now

  def __call__(self):
    return self.now


def lock(workdir, clock=None, host="node-a", pid=1000, alive=(1000, 2000), **kw):
  return workdir_lock.WorkdirLock(str(workdir), host=host, pid=pid, clock=clock or Clock(),
                                  is_alive=lambda p: p in alive, **kw)


def read_lock(workdir):
  return json.loads((workdir / "run.lock").read_text())


def test_the_chief_holds_the_lock_with_host_pid_and_since_and_removes_it_at_the_end(tmp_path):
  first = lock(tmp_path / "w", clock=Clock(1_800_000_000.0)).acquire()
  held = read_lock(tmp_path / "w")
  assert (held["host"], held["pid"], held["since"]) == ("node-a", 1000, 1_800_000_000.0)
  first.release()
  assert not (tmp_path / "w").exists()  # created for the lock and left empty: removed, nothing else touched


def test_a_second_run_on_a_live_lock_is_refused_naming_the_holder(tmp_path):
  first = lock(tmp_path, pid=1000).acquire()
  since = workdir_lock.describe(read_lock(tmp_path))
  with pytest.raises(ConfigError, match=re.escape(f"workdir {tmp_path} is in use by another run ({since})")):
    lock(tmp_path, pid=2000).acquire()
  assert "host node-a, pid 1000, since 2027-01-15" in since
  assert read_lock(tmp_path)["pid"] == 1000  # the holder's lock is untouched
  first.release()
  assert tmp_path.exists() and not (tmp_path / "run.lock").exists()  # a workdir it did not create stays


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
  lock(tmp_path, pid=3000, alive=()).acquire()  # never released: its process "died"
  second = lock(tmp_path, pid=2000, alive=(2000,)).acquire()
  assert read_lock(tmp_path)["pid"] == 2000
  assert re.search(r"taking over the lock of workdir .* from host node-a, pid 3000, since .*: process 3000 is no "
                   r"longer running", caplog.text)
  second.release()


def test_a_lock_with_this_hosts_name_and_this_pid_is_ours_from_before_a_restart(tmp_path, caplog):
  """A restarted pod keeps its host name and runs its command as pid 1 again: that lock is stale, not "in use"."""
  lock(tmp_path, host="job-worker-0", pid=1, alive=(1,)).acquire()._stop.set()
  lock(tmp_path, host="job-worker-0", pid=1, alive=(1,)).acquire().release()
  assert "process 1 is this process (restarted)" in caplog.text


@pytest.mark.parametrize("age, taken_over", [(299.0, False), (301.0, True)])
def test_another_hosts_lock_is_taken_over_only_when_its_heartbeat_is_stale(tmp_path, caplog, age, taken_over):
  clock = Clock()
  lock(tmp_path, clock=clock, host="node-b", pid=1000).acquire()._stop.set()
  clock.now += age
  second = lock(tmp_path, clock=clock, host="node-a", pid=1000)
  if taken_over:
    second.acquire()
    assert read_lock(tmp_path)["host"] == "node-a"
    assert "no heartbeat for 301 s (more than 300 s)" in caplog.text
  else:
    with pytest.raises(ConfigError, match="is in use by another run \\(host node-b, pid 1000"):
      second.acquire()


def test_the_heartbeat_is_refreshed_and_a_holder_that_lost_its_lock_stops_refreshing(tmp_path, caplog):
  clock = Clock()
  held = lock(tmp_path, clock=clock, heartbeat_seconds=0.02).acquire()
  clock.now += 100
  deadline = time.time() + 10
  while read_lock(tmp_path)["heartbeat"] != clock.now and time.time() < deadline:
    time.sleep(0.01)
  assert read_lock(tmp_path)["heartbeat"] == clock.now
  (tmp_path / "run.lock").write_text(json.dumps({"host": "node-c", "pid": 7, "since": clock.now, "heartbeat": 0,
                                                 "token": "theirs"}))
  held._thread.join(timeout=10)
  assert not held._thread.is_alive()
  assert "was taken over by host node-c, pid 7" in caplog.text
  held.release()
  assert read_lock(tmp_path)["token"] == "theirs"  # not ours any more: left in place


def test_tasks_other_than_the_chief_do_not_touch_the_lock(tmp_path):
  with workdir_lock.held(str(tmp_path), is_chief=True):
    with workdir_lock.held(str(tmp_path), is_chief=False) as other:  # a worker of the same job, same workdir
      assert other is None
    assert (tmp_path / "run.lock").exists()
  assert not (tmp_path / "run.lock").exists()


LONG = ["--config=configs/digits_cnn.py", "--config.train.epochs=2000", "--config.train.steps_per_loop=10",
        "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0", "--config.summary.progress_bar=off"]


@pytest.mark.e2e
def test_two_real_runs_on_one_workdir_the_second_stops_at_once_and_a_dead_holder_is_taken_over(tmp_path):
  workdir = tmp_path / "w"
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  # fresh, not forked (tests/child_site/forked.py): the lock names the pid of the process that runs
  first = subprocess.Popen([PY, "main.py", *LONG, f"--workdir={workdir}"], cwd=REPO,
                           env={**env, "TESTS_FRESH_PROCESSES": "1"}, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
  try:
    for line in first.stdout:
      if re.search(r"step \d+/", line):
        break
    config_before = (workdir / "config.json").read_bytes()
    started = time.monotonic()
    second = run_command([PY, "main.py", *LONG, f"--workdir={workdir}", "--config.seed=7"], env=env, timeout=120)
    refused_after = time.monotonic() - started
  finally:
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
  last = second.stderr.strip().splitlines()[-1]
  assert second.returncode == 1, second.stderr[-2000:]
  assert re.fullmatch(rf"error: workdir {workdir} is in use by another run \(host {re.escape(os.uname().nodename)}, "
                      rf"pid {first.pid}, since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\); wait for it to end or use another "
                      rf"--workdir \(if that run is gone, delete {workdir}/run.lock\)", last), last
  assert (workdir / "config.json").read_bytes() == config_before  # nothing of the first run was touched
  assert refused_after < 60, refused_after  # stopped before building anything (no training, no data pipeline)

  third = run_command([PY, "main.py", *LONG, f"--workdir={workdir}", "--config.train.epochs=0.5",
                          "--config.export=False"], env=env, timeout=300)
  assert third.returncode == 0, third.stderr[-2000:]
  assert re.search(rf"taking over the lock of workdir {workdir} from host .*, pid {first.pid}, since .*: process "
                   rf"{first.pid} is no longer running", third.stderr)
  assert not (workdir / "run.lock").exists()
