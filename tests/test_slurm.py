"""The sbatch templates under a stand-in SLURM: `srun` (one local task, forwards signals) and `scontrol` (writes its
arguments to a file) first on PATH, the template run with bash as sbatch would. SIGUSR1 to the batch shell (what
`#SBATCH --signal=B:USR1@120` does) must end in a checkpoint, `scontrol requeue JOB` and exit 0; rerunning the script
(the requeued job) resumes at the saved step. See launch/slurm/run_and_requeue.sh."""

import glob
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

PY = sys.executable
SLURM_DIR = os.path.join(REPO, "launch", "slurm")
# ~5 s of training at ~350 steps/s; the signal comes at the first progress line (step 10), the save ~0.5 s later.
FAST = ["--config.train.steps=600", "--config.train.steps_per_loop=10", "--config.eval.every_steps=0",
        "--config.checkpoint.every_steps=0", "--config.checkpoint.best_metric=", "--config.summary.progress_bar=off",
        "--config.export=False"]

FAKE_SRUN = f"""#!{PY}
# srun stand-in: its command is the one task of a one-node step; signals are forwarded to it, as srun does.
import os, signal, subprocess, sys
env = dict(os.environ, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NTASKS="1",
           SLURM_STEP_NUM_TASKS="1", SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="1")
command = sys.argv[1:]
while command[0].startswith("-"):  # srun's own options (--label, --cpus-per-task=N): one task anyway
  command = command[1:]
task, pending = None, []  # handlers first: a signal that comes while the task starts is forwarded once it runs
def forward(signum, frame):
  if task is None:
    pending.append(signum)
  else:
    task.send_signal(signum)
for number in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
  signal.signal(number, forward)
task = subprocess.Popen(command, env=env)
for number in pending:
  task.send_signal(number)
code = task.wait()
os._exit(128 - code if code < 0 else code)  # now: a late signal during Python's shutdown would kill it (143)
"""


def write_executable(path, text):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def free_port():
  """A free loopback port in 10000..19999: below the kernel's ephemeral range (32768 on, handed to any process's
  connections, so a requeued job could find its port taken) and the ports derived from SLURM job ids (20000 on)."""
  for port in random.Random(os.getpid()).sample(range(10000, 20000), 200):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return port
  raise RuntimeError("no free loopback port in 10000..19999")


def fake_bin(tmp_path, python):
  """A bin directory with srun, scontrol (appends its arguments to scontrol.log) and `python` (a script)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  write_executable(bin_dir / "srun", FAKE_SRUN)
  write_executable(bin_dir / "scontrol", f'#!/bin/sh\necho "$*" >> "{tmp_path / "scontrol.log"}"\n')
  write_executable(bin_dir / "python", python)
  return bin_dir


@pytest.fixture
def slurm(tmp_path):
  """srun, scontrol and python (this interpreter)."""
  return fake_bin(tmp_path, f'#!/bin/sh\nexec "{PY}" "$@"\n')


def scontrol_calls(tmp_path):
  log = tmp_path / "scontrol.log"
  return log.read_text().splitlines() if log.exists() else []


def job_env(bin_dir, template, workdir, job, extra=()):
  """The environment sbatch would give the template, plus the template's overrides for a fast digits run."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
  env.update(job, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", CONFIG="configs/digits_cnn.py",
             SLURM_JOB_NUM_NODES="1", EXTRA_ARGS=" ".join(extra))
  if template == "multi_node_mwms.sbatch":
    env.update(WORKDIR=str(workdir), COLLECTIVE="ring")
    env["EXTRA_ARGS"] += f" --config.cluster.slurm_port_base={free_port()}"
  else:  # one_node_mirrored: one run on the CPU (num_gpus=0) into WORKDIR_PREFIX-0gpu
    env.update(GPU_COUNTS="0", WORKDIR_PREFIX=str(workdir)[:-len("-0gpu")])
  return env


def run_job(template, env, timeout=240):
  return subprocess.run(["bash", os.path.join(SLURM_DIR, template)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=timeout)


def run_job_logging_to(log, template, env, timeout=30):
  """The job script with its output appended to the file `log`, as sbatch --open-mode=append does; its exit code."""
  with open(log, "a") as output:
    return subprocess.run(["bash", os.path.join(SLURM_DIR, template)], cwd=REPO, env=env, stdout=output,
                          stderr=subprocess.STDOUT, timeout=timeout).returncode


def start_and_signal(template, env, signal_batch_shell):
  """Starts the job script, waits for its first progress line, then signal_batch_shell(proc); returns (code, output)."""
  proc = subprocess.Popen(["bash", os.path.join(SLURM_DIR, template)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line)
      if re.search(r"step \d+/", line):
        break
    signal_batch_shell(proc)
    rest, _ = proc.communicate(timeout=180)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  return proc.returncode, "".join(lines) + rest


def saved_step(workdir):
  steps = [int(m.group(1)) for p in glob.glob(str(workdir / "checkpoints" / "ckpt-*.index"))
           if (m := re.search(r"ckpt-(\d+)\.index$", p))]
  return max(steps)


@pytest.mark.e2e
@pytest.mark.parametrize("template, job, requeued", [
    ("multi_node_mwms.sbatch", {"SLURM_JOB_ID": "4242"}, "4242"),
    ("one_node_mirrored.sbatch", {"SLURM_JOB_ID": "4300", "SLURM_ARRAY_JOB_ID": "4299", "SLURM_ARRAY_TASK_ID": "7"},
     "4299_7"),
], ids=["mwms-job", "mirrored-array-task"])
def test_usr1_to_the_batch_shell_saves_requeues_and_the_requeued_job_resumes(slurm, tmp_path, template, job,
                                                                             requeued):
  workdir = tmp_path / "run-0gpu"
  env = job_env(slurm, template, workdir, job, FAST)
  code, output = start_and_signal(template, env, lambda proc: os.kill(proc.pid, signal.SIGUSR1))  # B:USR1
  assert code == 0, output[-3000:]
  assert "preempted (SIGUSR1): checkpoint saved; exiting with code 143" in output, output[-3000:]
  assert f"requeued job {requeued}" in output
  assert output.index("preempted (SIGUSR1)") < output.index("requeued job")  # the shell waited for the save
  assert scontrol_calls(tmp_path) == [f"requeue {requeued}"]
  step = saved_step(workdir)
  assert 0 < step < 600

  rerun = run_job(template, dict(env, SLURM_RESTART_COUNT="1"))  # the requeued job: same script, same job
  assert rerun.returncode == 0, rerun.stdout[-3000:]
  assert f"restored {workdir}/checkpoints/ckpt-{step}" in rerun.stdout
  assert json.load(open(workdir / "summary.json"))["step"] == 600
  assert scontrol_calls(tmp_path) == [f"requeue {requeued}"]  # no second requeue


@pytest.mark.e2e
def test_a_user_error_is_passed_through_without_requeue(slurm, tmp_path):
  env = job_env(slurm, "multi_node_mwms.sbatch", tmp_path / "run-0gpu", {"SLURM_JOB_ID": "4444"},
                ["--config.train.no_such_key=1"])
  result = run_job("multi_node_mwms.sbatch", env)
  assert result.returncode == 1, result.stdout[-3000:]
  assert "error:" in result.stdout and "no_such_key" in result.stdout
  assert scontrol_calls(tmp_path) == []


STAND_IN = f"""#!{PY}
# python stand-in (no training): records its arguments; EXIT=N exits N, EXIT=sleep dies of any signal,
# EXIT=save saves for 1 s on SIGTERM/SIGUSR1 and exits 143, like main.py; EXIT=kill9 dies of SIGKILL at once,
# EXIT=kill9_on_term on SIGTERM (as after SLURM's KillWait); EXIT=srun_says:1,143:143 prints srun's per-task lines.
import os, signal, sys, time
with open(os.environ["ARGS_LOG"], "a") as f:
  f.write(" ".join(sys.argv[1:]) + "\\n")
mode = os.environ["EXIT"]
def save(signum, frame):
  signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SLURM's, srun's and the batch shell's SIGTERMs: one save
  time.sleep(1)
  print(f"preempted ({{signal.Signals(signum).name}}): checkpoint saved", flush=True)
  sys.exit(143)
if mode == "save":
  signal.signal(signal.SIGTERM, save)
  signal.signal(signal.SIGUSR1, save)
  print("step 10/100", flush=True)
if mode == "kill9":
  os.kill(os.getpid(), signal.SIGKILL)
if mode == "kill9_on_term":
  signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGKILL))
  print("step 10/100", flush=True)
if mode == "orphan":  # leaves a child behind that holds stderr open
  import subprocess
  subprocess.Popen(["sleep", "20"], stdout=subprocess.DEVNULL, start_new_session=True)
  sys.exit(0)
if mode.startswith("srun_says:"):  # what srun prints and returns: "srun_says:TASK_CODES:RETURN", e.g. "1,143:143"
  codes, returned = mode.split(":")[1:]
  for task, code in enumerate(codes.split(",")):
    print(f"srun: error: localhost: task {{task}}: Exited with exit code {{code}}", file=sys.stderr, flush=True)
  sys.exit(int(returned))
if mode in ("save", "sleep", "kill9_on_term"):
  time.sleep(60)
sys.exit(int(mode))
"""


@pytest.fixture
def stand_in(tmp_path):
  """srun, scontrol and a python that is STAND_IN (no training)."""
  return fake_bin(tmp_path, STAND_IN)


def stand_in_env(bin_dir, tmp_path, template, job, exit, extra=()):
  env = job_env(bin_dir, template, tmp_path / "run-0gpu", job, extra)
  env.update(EXIT=exit, ARGS_LOG=str(tmp_path / "args.log"))
  return env


@pytest.mark.e2e
@pytest.mark.parametrize("template", ["multi_node_mwms.sbatch", "one_node_mirrored.sbatch"])
@pytest.mark.parametrize("training_exit, job_exit, requeued", [(0, 0, False), (99, 0, True), (1, 1, False),
                                                                (128, 128, False), (160, 160, False)])
def test_only_the_preemption_exit_code_requeues(stand_in, tmp_path, template, training_exit, job_exit, requeued):
  """Codes 129..159 (a death by signal) are the lost-worker rule's, below."""
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "77"}, str(training_exit), ["--config.seed=3"])
  env["PREEMPTION_EXIT_CODE"] = "99"
  result = run_job(template, env, timeout=30)
  assert result.returncode == job_exit, result.stdout
  assert scontrol_calls(tmp_path) == (["requeue 77"] if requeued else [])
  args = (tmp_path / "args.log").read_text()
  assert "--config.preemption.signals=SIGTERM,SIGUSR1 --config.preemption.exit_code=99 --config.seed=3" in args
  assert "--config=configs/digits_cnn.py" in args


@pytest.mark.parametrize("template", ["multi_node_mwms.sbatch", "one_node_mirrored.sbatch"])
def test_a_training_killed_by_the_warning_before_its_handler_is_set_is_requeued_too(stand_in, tmp_path, template):
  """SIGUSR1 forwarded while the training is still starting (no handler yet: it dies of the signal, 128 + 10)."""
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "78"}, "sleep")
  proc = subprocess.Popen(["bash", os.path.join(SLURM_DIR, template)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    deadline = time.monotonic() + 20
    while not (tmp_path / "args.log").exists() and time.monotonic() < deadline:
      time.sleep(0.05)
    time.sleep(0.2)  # from the stand-in's first line to its sleep
    os.kill(proc.pid, signal.SIGUSR1)
    output, _ = proc.communicate(timeout=20)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  assert proc.returncode == 0, output
  assert "[slurm] SIGUSR1: the training saves a checkpoint and exits, then a requeue" in output
  assert "requeued job 78" in output
  assert scontrol_calls(tmp_path) == ["requeue 78"]


@pytest.mark.e2e
@pytest.mark.parametrize("template", ["multi_node_mwms.sbatch", "one_node_mirrored.sbatch"])
def test_sigterm_from_slurm_waits_for_the_save_and_does_not_requeue(stand_in, tmp_path, template):
  """scancel, the time limit, SLURM's own preemption: SIGTERM to every process of the job. The batch shell outlives
  the training's save, passes its 143 on and does not requeue (that would undo a scancel)."""
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "79"}, "save")
  code, output = start_and_signal(template, env, lambda proc: os.killpg(proc.pid, signal.SIGTERM))
  assert code == 143, output
  assert "[slurm] SIGTERM: SLURM is ending the job; the training saves and exits" in output  # the trap's own line
  assert output.index("preempted (SIGTERM): checkpoint saved") < output.index("SLURM is ending this job, so no requeue")
  assert scontrol_calls(tmp_path) == []


def test_templates_are_valid_bash_and_ask_for_the_warning_and_requeue():
  for path in glob.glob(os.path.join(SLURM_DIR, "*")):
    assert subprocess.run(["bash", "-n", path], capture_output=True).returncode == 0, path
  training = [p for p in glob.glob(os.path.join(SLURM_DIR, "*.sbatch")) if not p.endswith("data_service.sbatch")]
  assert len(training) == 2
  for path in training:
    text = open(path).read()
    for line in ("#SBATCH --signal=B:USR1@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "source launch/slurm/run_and_requeue.sh"):
      assert line in text, (path, line)
    sbatch_lines = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --output=slurm-%x-%j.out" in sbatch_lines, path  # the submit directory: SLURM can write there
    assert not [line for line in sbatch_lines if re.search(r"--gres|--cpus-per-task|--nodes=[^1]", line)], path
    for override in ("--gres=gpu:4", "--cpus-per-task=16"):  # documented in the header instead
      assert f"sbatch {override}" in text or f" {override} " in text, (path, override)
  assert "run_or_requeue srun --label " in open(os.path.join(SLURM_DIR, "multi_node_mwms.sbatch")).read()
  pool = open(os.path.join(SLURM_DIR, "data_service.sbatch")).read()  # a pool: no training, no requeue
  assert 'python -m data.service dispatcher --port="$PORT"' in pool
  assert 'srun --kill-on-bad-exit=1 python -m data.service worker --dispatcher="$HOST:$PORT"' in pool
  assert 'echo "grpc://$HOST:$PORT" > "$ADDRESS_FILE"' in pool


def requeue_record(tmp_path):
  """The record the templates give run_and_requeue.sh: the (stand-in's) workdir's slurm_requeues.txt."""
  return tmp_path / "run-0gpu" / "slurm_requeues.txt"


@pytest.mark.e2e
@pytest.mark.parametrize("template", ["multi_node_mwms.sbatch", "one_node_mirrored.sbatch"])
@pytest.mark.parametrize("earlier, restarts, max_requeues, job_exit, requeued", [
    ([], None, None, 0, True), (["81 lost_worker", "81 unasked_preemption"], "2", None, 0, True),
    ([], "7", None, 0, True),  # SLURM_RESTART_COUNT counts time-limit requeues too: not this bound's
    (["80 lost_worker"] * 3, "0", None, 0, True),  # another job's (an earlier submission on the same workdir)
    (["81 lost_worker"] * 3, "3", None, 137, False), ([], None, "0", 137, False)])
def test_a_task_killed_by_a_signal_is_a_lost_worker_requeued_a_bounded_number_of_times(
    stand_in, tmp_path, template, earlier, restarts, max_requeues, job_exit, requeued):
  """srun (or bash, for the mirrored template's lone python) returns 128 + 9 when a task got SIGKILL. The bound counts
  this job's own lost-worker and unasked requeues in the workdir's record, not SLURM_RESTART_COUNT."""
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "81"}, "kill9")
  env.update({k: v for k, v in (("SLURM_RESTART_COUNT", restarts), ("MAX_SIGNAL_REQUEUES", max_requeues)) if v})
  if earlier:
    requeue_record(tmp_path).parent.mkdir()
    requeue_record(tmp_path).write_text("".join(f"{line}\n" for line in earlier))
  result = run_job(template, env, timeout=30)
  assert result.returncode == job_exit, result.stdout
  assert scontrol_calls(tmp_path) == (["requeue 81"] if requeued else [])
  ours = len([line for line in earlier if line.startswith("81 ")])
  if requeued:
    assert (f"[slurm] a task died of SIGKILL (exit code 137): a lost worker, requeue {ours + 1} of at "
            "most 3 (MAX_SIGNAL_REQUEUES); requeued job 81" in result.stdout)
    assert requeue_record(tmp_path).read_text().splitlines() == earlier + ["81 lost_worker"]
  else:
    assert (f"and this job was requeued {ours} times for a lost worker or an unasked preemption code "
            f"(MAX_SIGNAL_REQUEUES={max_requeues or 3}, counted in {requeue_record(tmp_path)}): no more requeues"
            in result.stdout)
    assert requeue_record(tmp_path).read_text().splitlines() == earlier if earlier else True


@pytest.mark.parametrize("template", ["multi_node_mwms.sbatch", "one_node_mirrored.sbatch"])
def test_an_unasked_preemption_code_requeues_a_bounded_number_of_times(stand_in, tmp_path, template):
  """Every process exits 143 with no SIGUSR1 at the batch shell (a stuck peer on every run): three requeues, then the
  job ends with 143 instead of requeueing for ever. Each run is the requeued job: same id, same workdir."""
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "86"}, "143")
  for run in range(1, 4):
    result = run_job(template, dict(env, SLURM_RESTART_COUNT=str(run - 1)), timeout=30)
    assert result.returncode == 0, result.stdout
    assert ("[slurm] the training exited with the preemption code 143 without SLURM's warning (a lost or stuck "
            f"peer?), requeue {run} of at most 3 (MAX_SIGNAL_REQUEUES); requeued job 86") in result.stdout
  result = run_job(template, dict(env, SLURM_RESTART_COUNT="3"), timeout=30)
  assert result.returncode == 143, result.stdout
  assert "this job was requeued 3 times for a lost worker or an unasked preemption code" in result.stdout
  assert scontrol_calls(tmp_path) == ["requeue 86"] * 3
  assert requeue_record(tmp_path).read_text() == "86 unasked_preemption\n" * 3


@pytest.mark.parametrize("srun_says, job_exit, requeued", [
    ("1,143:143", 1, False), ("143,2:143", 2, False), ("143,143:143", 0, True), ("0,143:143", 0, True),
    ("143,137:137", 0, True)])
def test_a_tasks_own_error_under_the_preemption_code_of_its_peer_is_not_requeued(
    stand_in, tmp_path, srun_says, job_exit, requeued):
  """srun returns the largest task code: a user error (1) under a peer's 143 is read from srun's own lines."""
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {"SLURM_JOB_ID": "83"}, f"srun_says:{srun_says}")
  log = tmp_path / "slurm-83.out"
  log.write_text("srun: error: localhost: task 1: Exited with exit code 7\n")  # an earlier run's, in append mode
  code = run_job_logging_to(log, "multi_node_mwms.sbatch", env)
  assert code == job_exit, log.read_text()
  assert scontrol_calls(tmp_path) == (["requeue 83"] if requeued else [])
  if not requeued:
    failed = srun_says.split(":")[0].split(",").index(str(job_exit))
    assert (f"[slurm] task {failed} exited with code {job_exit} (not a preemption; the job's code was 143): no "
            "requeue" in log.read_text())


def test_a_child_left_holding_stderr_does_not_keep_the_batch_script_waiting(stand_in, tmp_path):
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {"SLURM_JOB_ID": "84"}, "orphan")
  started = time.monotonic()  # the log is a file: a pipe would stay open while the child lives
  code = run_job_logging_to(tmp_path / "job.log", "multi_node_mwms.sbatch", env, timeout=15)
  assert code == 0 and time.monotonic() - started < 12, (tmp_path / "job.log").read_text()
  assert scontrol_calls(tmp_path) == []


def test_a_signal_death_after_slurms_sigterm_is_not_requeued(stand_in, tmp_path):
  """scancel, then SIGKILL after KillWait: the job is ending, a requeue would undo the scancel."""
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {"SLURM_JOB_ID": "82"}, "kill9_on_term")
  code, output = start_and_signal("multi_node_mwms.sbatch", env, lambda proc: os.killpg(proc.pid, signal.SIGTERM))
  assert code == 137, output
  assert scontrol_calls(tmp_path) == []
  assert "lost worker" not in output


def test_a_bad_max_signal_requeues_is_one_line(stand_in, tmp_path):
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {"SLURM_JOB_ID": "83"}, "0")
  result = run_job("multi_node_mwms.sbatch", dict(env, MAX_SIGNAL_REQUEUES="many"), timeout=30)
  assert (result.returncode, result.stdout) == (
      1, "error: MAX_SIGNAL_REQUEUES must be a number of requeues >= 0, got 'many'\n")


@pytest.mark.parametrize("template, workdir", [("multi_node_mwms.sbatch", "runs/digits_cnn-mwms-1nodes-1"),
                                               ("one_node_mirrored.sbatch", "runs/digits_cnn-1-0gpu")])
def test_an_array_task_gets_its_own_default_workdir_named_after_the_config(stand_in, tmp_path, template, workdir):
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "85", "SLURM_ARRAY_JOB_ID": "84",
                                                    "SLURM_ARRAY_TASK_ID": "1"}, "0")
  env.pop("WORKDIR", None)
  env.pop("WORKDIR_PREFIX", None)
  result = run_job(template, env, timeout=30)
  assert result.returncode == 0, result.stdout
  assert f"--workdir={workdir} " in (tmp_path / "args.log").read_text()


@pytest.mark.parametrize("template, kind, config, name", [
    ("multi_node_mwms.sbatch", "mwms", "configs/digits_cnn.py", "digits_cnn-mwms"),
    ("one_node_mirrored.sbatch", "mirrored", "configs/cifar_resnet20.py", "cifar_resnet20-mirrored"),
    ("multi_node_mwms.sbatch", "mwms", "configs/base.py:synthetic", "base-synthetic-mwms")])
def test_the_job_and_its_log_are_named_after_the_config(stand_in, tmp_path, template, kind, config, name):
  """sbatch opened slurm-<#SBATCH --job-name>-<job>.out in the submit directory; the job renames itself and its log
  (the same file: what was written before and after is in it) after CONFIG."""
  env = stand_in_env(stand_in, tmp_path, template, {"SLURM_JOB_ID": "90", "SLURM_JOB_NAME": kind,
                                                    "SLURM_SUBMIT_DIR": str(tmp_path)}, "0")
  env["CONFIG"] = config
  opened = tmp_path / f"slurm-{kind}-90.out"
  opened.write_text("slurmstepd: a line before the script\n")
  assert run_job_logging_to(opened, template, env) == 0
  assert not opened.exists()
  log = (tmp_path / f"slurm-{name}-90.out").read_text()
  assert log.startswith("slurmstepd: a line before the script\n"), log
  assert scontrol_calls(tmp_path) == [f"update JobId=90 JobName={name}"]
  assert f"--config={config} " in (tmp_path / "args.log").read_text()


def test_the_log_is_renamed_when_the_submit_directory_is_a_symlink(stand_in, tmp_path):
  """/proc names the open log without symlinks; SLURM_SUBMIT_DIR is the path sbatch ran in (e.g. /home -> /data)."""
  (tmp_path / "real").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "real")
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {
      "SLURM_JOB_ID": "93", "SLURM_JOB_NAME": "mwms", "SLURM_SUBMIT_DIR": str(tmp_path / "link")}, "0")
  assert run_job_logging_to(tmp_path / "link" / "slurm-mwms-93.out", "multi_node_mwms.sbatch", env) == 0
  assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["slurm-digits_cnn-mwms-93.out"]


def test_a_job_named_by_its_submitter_keeps_its_name_and_log(stand_in, tmp_path):
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {
      "SLURM_JOB_ID": "91", "SLURM_JOB_NAME": "mine", "SLURM_SUBMIT_DIR": str(tmp_path)}, "0")
  opened = tmp_path / "slurm-mine-91.out"
  assert run_job_logging_to(opened, "multi_node_mwms.sbatch", env) == 0
  assert opened.exists() and [p.name for p in tmp_path.glob("slurm-*")] == ["slurm-mine-91.out"]
  assert scontrol_calls(tmp_path) == []


@pytest.mark.parametrize("name, scontrol_fails", [("mwms", True), ("digits_cnn-mwms", False)],
                         ids=["rename-failed", "log-pattern-kept"])
def test_a_requeue_logged_under_the_first_name_appends_to_the_first_runs_log(stand_in, tmp_path, name,
                                                                               scontrol_fails):
  """The requeued run's SLURM opened slurm-mwms-92.out again (the rename failed, or SLURM kept the log's first name):
  the script writes on in the renamed log of the first run instead of replacing it."""
  env = stand_in_env(stand_in, tmp_path, "multi_node_mwms.sbatch", {
      "SLURM_JOB_ID": "92", "SLURM_JOB_NAME": name, "SLURM_SUBMIT_DIR": str(tmp_path)}, "srun_says:0:0")
  renamed = tmp_path / "slurm-digits_cnn-mwms-92.out"
  renamed.write_text("the first run\n")
  if scontrol_fails:
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nexit 1\n")
  assert run_job_logging_to(tmp_path / "slurm-mwms-92.out", "multi_node_mwms.sbatch", env) == 0
  log = renamed.read_text()
  assert log.startswith("the first run\n") and "srun: error: localhost: task 0: Exited with exit code 0" in log, log
  assert ("[slurm] could not rename job 92 to digits_cnn-mwms (scontrol update failed)" in log) == scontrol_fails
  assert (tmp_path / "slurm-mwms-92.out").read_text() == ""
  assert scontrol_calls(tmp_path) == []
