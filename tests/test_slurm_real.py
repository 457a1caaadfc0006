"""The shipped sbatch templates under a real SLURM (Debian's slurm-wlm 22.05): one private one-node cluster for the
module (munged, slurmctld and slurmd as root in a temporary directory: tests/fixtures/slurm/start_cluster.sh),
jobs submitted with the real sbatch from a fresh copy of the repository, on CPU, digits, a few dozen steps:

  two 2-task MultiWorkerMirrored jobs (an array) at once on one node train to the end, each on its own ports and
  workdir; a job survives a lost worker (kill -9: srun returns 137, requeue) and then SLURM's own SIGUSR1 (`scancel
  --batch --signal=USR1`: save, requeue), resumes each time and finishes once; scancel's SIGTERM: save, no requeue;
  `sbatch --ntasks=2 --wrap "python main.py ..."`: one local process, not a 2-worker cluster; one task's user error
  under its peer's 143 (what srun returns) fails the job without a requeue.

Every TensorFlow process costs ~9 s of CPU to start, so the jobs are few (12 starts, ~2-3 min on 2 busy cores).
The module skips, naming the packages, where SLURM is not installed (and where it cannot run its daemons as root).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import REPO

FIXTURES = os.path.join(REPO, "tests", "fixtures", "slurm")
INSTALL = "apt-get install -y slurmctld slurmd slurm-client munge"
DAEMONS_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
BINARIES = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
FAST = ("--config.train.steps_per_loop=5 --config.eval.every_steps=0 --config.checkpoint.every_steps=0 "
        "--config.checkpoint.best_metric= --config.export=False --config.summary.progress_bar=off")
# Each train call of 5 steps ends with a 0.5 s pause: 80 steps last >= 8 s, so a signal arrives mid-training.
PAUSED = FAST + " --config.train.steps=80 --config.callbacks=('tests.fixtures.slurm.pause:pause',)"


class Cluster:
  """The running cluster: sbatch/scontrol/scancel against it, jobs run in `repo` (a fresh copy)."""

  def __init__(self, conf, repo):
    self.conf, self.repo = conf, repo

  def env(self, **overrides):
    """The submitter's environment (sbatch exports it to the job): this interpreter's python, digits, ring."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith(("SLURM_", "PYTEST_"))}
    env.update(SLURM_CONF=self.conf, PATH=f"{os.path.dirname(sys.executable)}:{DAEMONS_PATH}",
               CONFIG="configs/digits_cnn.py", COLLECTIVE="ring", PAUSE_SECONDS="0.5", **overrides)
    return env

  def run(self, *command, **env):
    return subprocess.run(command, cwd=self.repo, env=self.env(**env), capture_output=True, text=True, timeout=60,
                          check=True)

  def submit(self, *sbatch_args, **env):
    """sbatch --parsable ARGS from the copy's root; returns the job id."""
    return self.run("sbatch", "--parsable", *sbatch_args, **env).stdout.strip().split(";")[0]

  def jobs(self, job):
    """scontrol's record of the job (one per array task), as {field: value} dicts."""
    lines = self.run("scontrol", "-o", "show", "job", job).stdout.splitlines()
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines if line.strip()]

  def wait_until_ended(self, job, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      records = self.jobs(job)
      if all(r["JobState"] in ENDED for r in records):
        return records
      time.sleep(0.5)
    raise AssertionError(f"job {job} did not end in {timeout} s: {self.jobs(job)}\n{self.logs()[-3000:]}")

  def log(self, name, job):
    path = os.path.join(self.repo, f"slurm-{name}-{job}.out")
    return open(path).read() if os.path.exists(path) else ""

  def logs(self):
    """All job logs (for failure messages)."""
    return "".join(open(os.path.join(self.repo, f)).read() for f in sorted(os.listdir(self.repo))
                   if f.startswith("slurm-"))

  def wait_for_line(self, name, job, pattern, after=0, timeout=180):
    """Waits for a line matching pattern (at or after character `after` of the log); returns its match."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      found = re.compile(pattern, re.M).search(self.log(name, job), after)
      if found:
        return found
      if all(r["JobState"] in ENDED for r in self.jobs(job)):
        break
      time.sleep(0.2)
    raise AssertionError(f"no line /{pattern}/ in job {job}'s log: {self.jobs(job)}\n{self.log(name, job)[-3000:]}")


def fresh_copy(destination):
  """The repository's files as git lists them (tracked, and new ones not ignored), without runs/ or .venv."""
  listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                          check=True).stdout.decode().split("\0")
  for name in listed:
    if name and os.path.isfile(os.path.join(REPO, name)):
      os.makedirs(os.path.join(destination, os.path.dirname(name)), exist_ok=True)
      shutil.copy2(os.path.join(REPO, name), os.path.join(destination, name))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  """One private cluster (8 CPUs declared) for the module; always stopped by its pid files."""
  missing = [name for name in BINARIES if not shutil.which(name, path=DAEMONS_PATH)]
  if missing:
    pytest.skip(f"real SLURM not installed (no {', '.join(missing)}); to run these tests: {INSTALL}")
  if os.geteuid() != 0:
    pytest.skip("the private SLURM cluster runs munged, slurmctld and slurmd as root; run these tests as root")
  repo = tmp_path_factory.mktemp("slurm") / "repo"
  fresh_copy(repo)
  # Not under pytest's 0700 directories: munged wants every directory above its socket executable by all.
  directory = tempfile.mkdtemp(prefix="slurm-test-")
  try:
    started = subprocess.run([os.path.join(FIXTURES, "start_cluster.sh"), directory, "8"], capture_output=True,
                             text=True, timeout=90, env=dict(os.environ, PATH=DAEMONS_PATH))
    assert started.returncode == 0, f"start_cluster.sh failed:\n{started.stdout}{started.stderr}"
    yield Cluster(os.path.join(directory, "slurm.conf"), str(repo))
  finally:
    subprocess.run([os.path.join(FIXTURES, "stop_cluster.sh"), directory, "--purge"], capture_output=True,
                   timeout=120, env=dict(os.environ, PATH=DAEMONS_PATH))


def summary(slurm, workdir):
  return json.load(open(os.path.join(slurm.repo, workdir, "summary.json")))


def saved_steps(slurm, workdir):
  names = os.listdir(os.path.join(slurm.repo, workdir, "checkpoints"))
  return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"ckpt-(\d+)\.index", n)))


@pytest.mark.e2e
def test_a_job_survives_a_lost_worker_and_slurms_usr1_resuming_each_time_and_finishes_once(slurm):
  """kill -9 of task 1's python: srun returns 137, a lost worker, requeued; in the requeued run SLURM's own SIGUSR1
  (what --signal=B:USR1@120 sends before the time limit): both tasks save, requeued again; the third run finishes."""
  job = slurm.submit("--nodes=1", "--ntasks=2", "launch/slurm/multi_node_mwms.sbatch", WORKDIR="runs/requeue",
                     EXTRA_ARGS=f"{PAUSED} --config.checkpoint.every_steps=15")
  slurm.wait_for_line("digits_cnn-mwms", job, r"^0: .*saved checkpoint runs/requeue/checkpoints/ckpt-15$")
  pids = [line.split() for line in slurm.run("scontrol", "listpids", job).stdout.splitlines()[1:]]
  [task_1] = [int(pid) for pid, _, step, local_id, *_ in pids if (step, local_id) == ("0", "1")]
  os.kill(task_1, signal.SIGKILL)
  first = slurm.wait_for_line("digits_cnn-mwms", job, r"^0: .*restored runs/requeue/checkpoints/ckpt-(\d+)$")
  slurm.wait_for_line("digits_cnn-mwms", job, r"^0: .*step \d+/80", after=first.end())
  slurm.run("scancel", "--batch", "--signal=USR1", job)
  [record] = slurm.wait_until_ended(job)
  log = slurm.log("digits_cnn-mwms", job)
  assert (record["JobState"], record["ExitCode"], record["Restarts"]) == ("COMPLETED", "0:0", "2"), log[-4000:]
  assert re.search(r"^srun: error: \S+: task 1: Killed$", log, re.M), log[-4000:]
  assert log.count("[slurm] a task died of SIGKILL (exit code 137): a lost worker, requeue 1 of at most 3 "
                   f"(MAX_SIGNAL_REQUEUES); requeued job {job}") == 1
  assert log.count("[slurm] SIGUSR1: the training saves a checkpoint and exits, then a requeue") == 1
  assert len(re.findall(r"^[01]: .*preempted \(SIGUSR1\): checkpoint saved; exiting with code 143", log, re.M)) == 2
  assert log.count(f"[slurm] checkpoint saved; requeued job {job}") == 1
  restored = [int(n) for n in re.findall(r"^0: .*restored runs/requeue/checkpoints/ckpt-(\d+)$", log, re.M)]
  assert len(restored) == 2 and 15 <= restored[0] < restored[1] < 80, log[-4000:]
  assert len(re.findall(r"^0: .*done: step=80/80 in ", log, re.M)) == 1  # finished exactly once
  assert summary(slurm, "runs/requeue")["step"] == 80


@pytest.mark.e2e
def test_scancel_saves_a_checkpoint_and_does_not_requeue(slurm):
  job = slurm.submit("launch/slurm/one_node_mirrored.sbatch", GPU_COUNTS="0", WORKDIR_PREFIX="runs/cancel",
                     EXTRA_ARGS=PAUSED)
  slurm.wait_for_line("digits_cnn-mirrored", job, r"step \d+/80")
  slurm.run("scancel", job)  # SIGTERM to every process of the job, SIGKILL after KillWait (5 s)
  [record] = slurm.wait_until_ended(job)
  slurm.wait_for_line("digits_cnn-mirrored", job, r"SLURM is ending this job, so no requeue", timeout=30)
  log = slurm.log("digits_cnn-mirrored", job)
  assert (record["JobState"], record["Restarts"]) == ("CANCELLED", "0"), log[-3000:]
  assert "[slurm] SIGTERM: SLURM is ending the job; the training saves and exits" in log
  assert "preempted (SIGTERM): checkpoint saved; exiting with code 143" in log
  assert "requeued" not in log
  steps = saved_steps(slurm, "runs/cancel-0gpu")
  assert len(steps) == 1 and 0 < steps[0] < 80, log[-3000:]
  assert not os.path.exists(os.path.join(slurm.repo, "runs/cancel-0gpu/summary.json"))


@pytest.mark.e2e
def test_two_mwms_jobs_of_two_tasks_train_to_the_end_at_once_on_one_node(slurm):
  """An array of two `sbatch --nodes=1 --ntasks=2` jobs. Each array task has its own SLURM_JOB_ID, hence its own
  ports (with one fixed port base the second could not start its gRPC server) and its own default workdir."""
  job = slurm.submit("--array=0-1", "--nodes=1", "--ntasks=2", "launch/slurm/multi_node_mwms.sbatch",
                     EXTRA_ARGS=f"--config.train.steps=60 {FAST}")
  records = slurm.wait_until_ended(job)
  logs = {r["ArrayTaskId"]: slurm.log("digits_cnn-mwms", r["JobId"]) for r in records}
  assert sorted(logs) == ["0", "1"]
  for record in records:
    assert (record["JobState"], record["ExitCode"], record["Restarts"]) == ("COMPLETED", "0:0", "0"), (
        logs[record["ArrayTaskId"]][-4000:])
  first, second = records
  assert first["StartTime"] <= second["EndTime"] and second["StartTime"] <= first["EndTime"]  # at the same time
  for task, log in logs.items():
    result = summary(slurm, f"runs/digits_cnn-mwms-1nodes-{task}")
    assert result["step"] == result["total_steps"] == 60 and result["replicas"] == 2
    assert result["eval/accuracy"] >= 0.6  # ~0.93 after 60 steps; chance is 0.1
    assert re.search(r"^0: .*step 60/60", log, re.M) and re.search(r"^1: .*process worker:1 of 2 workers", log, re.M)


@pytest.mark.e2e
def test_a_batch_shell_with_two_tasks_trains_as_one_local_process(slurm):
  """SLURM_NTASKS=2 in the batch shell is no cluster: without srun there is one process, so auto trains locally
  (`sbatch --ntasks=2 --wrap "python main.py ..."`; before, it stopped: one_device in a 2-worker cluster)."""
  command = f"python main.py --config=configs/digits_cnn.py --workdir=runs/wrap --config.train.steps=20 {FAST}"
  job = slurm.submit("--ntasks=2", "--job-name=wrap", "--output=slurm-%x-%j.out", "--wrap", command)
  [record] = slurm.wait_until_ended(job, timeout=120)
  log = slurm.log("wrap", job)
  assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
  result = summary(slurm, "runs/wrap")
  assert result["step"] == 20 and result["replicas"] == 1


# Two bash tasks (no training) under the requeue wrapper: task 1 fails with a user error while task 0 exits with the
# preemption code, as a worker that lost its peer does (tests/test_reliability.py); srun returns the larger, 143.
USER_ERROR_UNDER_A_PEERS_143 = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --requeue
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
source launch/slurm/run_and_requeue.sh
run_or_requeue srun --label bash -c 'if [ "$SLURM_PROCID" = 1 ]; then echo "error: a user bug" >&2; exit 1; fi
                                     sleep 1; exit 143'
echo "not reached"
"""


def test_one_tasks_user_error_under_its_peers_143_fails_the_job_without_a_requeue(slurm):
  """srun's own per-task lines tell a user error (1) from the 143 of the peer that lost it: no requeue loop."""
  with open(os.path.join(slurm.repo, "user_error.sbatch"), "w") as script:
    script.write(USER_ERROR_UNDER_A_PEERS_143)
  job = slurm.submit("--job-name=user-error", "user_error.sbatch")
  [record] = slurm.wait_until_ended(job, timeout=60)
  log = slurm.log("user-error", job)
  assert (record["JobState"], record["ExitCode"], record["Restarts"]) == ("FAILED", "1:0", "0"), log
  assert re.search(r"^srun: error: \S+: task 0: Exited with exit code 143$", log, re.M), log  # what srun returned
  assert ("[slurm] task 1 exited with code 1 (not a preemption; the job's code was 143): no requeue, rerunning "
          "would fail again; see that task's error above") in log
  assert "1: error: a user bug" in log and "requeued" not in log and "not reached" not in log
