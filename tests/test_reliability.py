"""Fault injection with real processes: SIGTERM (preemption) on one_device, mirrored, 2-worker MWMS and parameter
servers; kill -9 at several points and during a checkpoint write; a corrupt checkpoint; a lost MWMS worker;
NaN rollback; memory over thousands of steps. Resumed runs are compared bit for bit with uninterrupted ones."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from loops import run
from tests.conftest import REPO, load_config, run_command
from tests.test_train import model_weights

PY = sys.executable
FIXTURES = os.path.join(REPO, "tests", "fixtures", "user_losses")
LONG = ["--config=configs/digits_cnn.py", "--config.train.epochs=2000", "--config.train.steps_per_loop=10",
        "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0", "--config.summary.progress_bar=off"]


# Deterministic digits runs (op determinism, seeded data): a resumed run must end bit-identical to an uninterrupted one.
EXACT = ["--config=configs/digits_cnn.py", "--config.deterministic=True", "--config.train.steps_per_loop=5",
         "--config.eval.every_steps=0", "--config.checkpoint.every_steps=20", "--config.checkpoint.best_metric=",
         "--config.summary.progress_bar=off", "--config.export=False"]


def env():
  return {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}


def checkpoint_tensors(workdir):
  """{name: array} of every tensor (weights, optimizer slots, step) in workdir's latest checkpoint, and its path."""
  path = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))
  reader = tf.train.load_checkpoint(path)
  names = [n for n in reader.get_variable_to_dtype_map() if "OBJECT_GRAPH" not in n]
  return os.path.basename(path), {n: reader.get_tensor(n) for n in names}


def assert_bit_identical(workdir, reference, extra_saves=0):
  """Every tensor of the latest checkpoints equal; `extra_saves`: preemption saves the run made beyond the
  reference's (each adds one to save_counter, a count of saves, not training state)."""
  (name, tensors), (ref_name, ref_tensors) = checkpoint_tensors(workdir), checkpoint_tensors(reference)
  assert name == ref_name
  assert sorted(tensors) == sorted(ref_tensors) and len(tensors) > 10
  counter = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"
  ref_tensors[counter] = ref_tensors[counter] + extra_saves
  for key in ref_tensors:
    np.testing.assert_array_equal(tensors[key], ref_tensors[key], err_msg=key)


def run_until(command, pattern, environment=None, delay=0.0):
  """Starts command, reads its output until a line matches pattern (a list: each in turn), waits delay s, kill -9s
  it; returns all it wrote before dying (read to the end after the kill)."""
  proc = subprocess.Popen(command, cwd=REPO, env=environment or env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  lines, patterns = [], [pattern] if isinstance(pattern, str) else list(pattern)
  try:
    for line in proc.stdout:
      lines.append(line)
      if re.search(patterns[0], line):
        patterns.pop(0)
      if not patterns:
        time.sleep(delay)
        break
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  lines.append(proc.stdout.read())
  return "".join(lines)


def start_and_sigterm(command, target_pattern, tmp_path, wait_for=r"step \d+/", signum=signal.SIGTERM):
  """Starts command, waits for a progress line, signals (SIGTERM) the process whose pid the pattern finds; returns
  (exit code, output)."""
  proc = subprocess.Popen(command, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line)
      if re.search(wait_for, line):
        break
    pid = target_pattern(proc, "".join(lines))
    os.kill(pid, signum)
    rest, _ = proc.communicate(timeout=180)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  return proc.returncode, "".join(lines) + rest


def split_by_sigterm_matches_straight(args, tmp_path, wait_for):
  """Runs `args` (a main.py command without --workdir) straight, and again split by SIGTERM once a line matches
  wait_for and rerun; asserts the split run ends bit-identical to the straight one (one preemption save more).
  Returns (straight run's output, resumed run's output)."""
  straight = run_command(args + [f"--workdir={tmp_path / 'ref'}"], env=env(), timeout=300)
  assert straight.returncode == 0, straight.stderr[-3000:]
  split = args + [f"--workdir={tmp_path / 'w'}"]
  code, output = start_and_sigterm(split, lambda proc, _: proc.pid, tmp_path, wait_for=wait_for)
  assert code == 143, output[-3000:]
  resumed = run_command(split, env=env(), timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert_bit_identical(tmp_path / "w", tmp_path / "ref", extra_saves=1)
  return straight.stderr + straight.stdout, resumed.stderr + resumed.stdout


def launched_pid(task):
  """For start_and_sigterm: the pid of `task` (e.g. "worker:1") from launch.local's "started" line."""
  return lambda proc, output: int(re.search(rf"\[launch\] {task} started \(pid (\d+)\)", output).group(1))


def resume_for_20_more_steps(command, workdir):
  """After a preemption: the checkpoint is at a call boundary; rerunning command for 20 more steps restores it and
  ends at step + 20. Returns (step, the rerun's output)."""
  step = saved_step(workdir)
  assert step > 0 and step % 10 == 0
  resumed = run_command(command + [f"--config.train.steps={step + 20}"], env=env(), timeout=300, merge_output=True)
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert f"restored {workdir}/checkpoints/ckpt-{step}" in resumed.stdout
  assert json.load(open(workdir / "summary.json"))["step"] == step + 20
  return step, resumed.stdout


def saved_step(workdir):
  return int(tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints")).rsplit("-", 1)[1])


@pytest.mark.e2e
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_sigterm_saves_at_the_current_step_exits_143_and_the_rerun_resumes_there(strategy, tmp_path):
  workdir = tmp_path / "run"
  args = [PY, "main.py", *LONG, f"--workdir={workdir}", f"--config.strategy={strategy}",
          f"--config.cpu_replicas={2 if strategy == 'mirrored' else 0}"]
  code, output = start_and_sigterm(args, lambda proc, _: proc.pid, tmp_path)
  assert code == 143, output[-3000:]
  assert "preempted (SIGTERM): checkpoint saved; exiting with code 143" in output
  step, output = resume_for_20_more_steps(args, workdir)
  assert re.search(rf"step {step + 10}/{step + 20}", output)


@pytest.mark.e2e
def test_a_configured_signal_to_one_mwms_worker_saves_on_all_workers_and_exits_with_the_configured_code(tmp_path):
  workdir = tmp_path / "mw"
  command = [PY, "-m", "launch.local", "--workers=2", "--", PY, "main.py", *LONG, f"--workdir={workdir}",
             "--config.strategy=multi_worker_mirrored", "--config.preemption.signals=SIGTERM,SIGUSR1",
             "--config.preemption.exit_code=85"]

  code, output = start_and_sigterm(command, launched_pid("worker:1"), tmp_path, wait_for=r"\[worker:0\].*step \d+/",
                                   signum=signal.SIGUSR1)
  assert code == 85, output[-3000:]
  assert re.search(r"\[launch\] worker:[01] was preempted \(exit code 85, checkpoint saved\)", output)
  # the signal reached worker 1 only; worker 0 learnt it from the coordination service; both saved the same step
  assert re.search(r"\[worker:1\].*preempted \(SIGUSR1\): checkpoint saved; exiting with code 85", output)
  assert re.search(r"\[worker:0\].*preempted \(by a peer or the platform\): checkpoint saved", output)
  assert saved_step(workdir) > 0
  assert "is deprecated" not in output, output[-3000:]  # TensorFlow's PreemptionCheckpointHandler.total_run_calls


def nan_config(tiny_digits, monkeypatch, loss, call, mode, retries=3):
  """tiny_digits with a loss that turns NaN at its `call`-th call (1 = the eager validation call, then one per
  step; no eval in between)."""
  monkeypatch.syspath_prepend(FIXTURES)
  import my_losses
  my_losses.CALLS.assign(0)
  tiny_digits.loss.name = f"my_losses:{loss}"
  tiny_digits.loss.kwargs = ml_collections.ConfigDict({"call": call})
  tiny_digits.eval.every_steps = 0
  tiny_digits.nan_policy.mode, tiny_digits.nan_policy.max_retries = mode, retries
  tiny_digits.export = False  # no test of it reads an export (1-2 s a run)
  return tiny_digits


def test_a_nan_stops_the_run_naming_the_steps(tiny_digits, tmp_path, monkeypatch):
  nan_config(tiny_digits, monkeypatch, "nan_at_call", 8, "stop")  # step 7
  with pytest.raises(FloatingPointError, match=r"non-finite loss in steps 6\.\.10 \(nan_policy.mode=stop\)"):
    run.train_and_evaluate(tiny_digits, str(tmp_path))


@pytest.mark.e2e
def test_a_transient_nan_rolls_back_to_the_last_checkpoint_and_continues(tiny_digits, tmp_path, monkeypatch):
  nan_config(tiny_digits, monkeypatch, "nan_at_call", 13, "rollback", 1)  # step 12, after ckpt-10
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path / "rolled"))
  assert summary["step"] == 20 and summary["nan_rollbacks"] == 1
  nan_config(tiny_digits, monkeypatch, "nan_at_call", 10**9, "rollback", 1)  # the same run without the fault
  clean = run.train_and_evaluate(tiny_digits, str(tmp_path / "clean"))
  assert clean["nan_rollbacks"] == 0
  rolled, reference = model_weights(str(tmp_path / "rolled")), model_weights(str(tmp_path / "clean"))
  for key in reference:  # the input was rewound with the weights: steps 11..20 saw the same batches
    np.testing.assert_allclose(rolled[key], reference[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_a_persistent_nan_exhausts_the_retries(tiny_digits, tmp_path, monkeypatch):
  nan_config(tiny_digits, monkeypatch, "nan_from_call", 13, "rollback", 2)
  with pytest.raises(FloatingPointError, match=r"non-finite loss in steps 11\.\.15 after 2 rollback\(s\)"):
    run.train_and_evaluate(tiny_digits, str(tmp_path))


@pytest.mark.e2e
def test_resident_memory_does_not_grow_over_thousands_of_steps(tiny_digits, tmp_path, monkeypatch):
  """RSS sampled at every train call of a 3 000-step run: the last sample is within 10 % of the one after warm-up."""
  from loops.core import progress as progress_lib

  samples = []
  record = progress_lib.Progress.record

  def sampling_record(self, step, seconds):
    with open("/proc/self/statm") as f:
      samples.append(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    return record(self, step, seconds)

  monkeypatch.setattr(progress_lib.Progress, "record", sampling_record)
  tiny_digits.train.steps, tiny_digits.train.steps_per_loop, tiny_digits.train.global_batch_size = 3000, 50, 16
  tiny_digits.eval.every_steps, tiny_digits.checkpoint.every_steps = 1000, 1000
  tiny_digits.export = False  # after the last sample: nothing of it is measured
  run.train_and_evaluate(tiny_digits, str(tmp_path))
  assert len(samples) == 60
  warm = samples[9]  # after 500 steps, 1 eval-free stretch: tracing and pipeline buffers are in place
  print(f"RSS after step 500: {warm / 2**20:.1f} MiB; after step 2500: {samples[49] / 2**20:.1f} MiB "
        f"({samples[49] / warm - 1:+.2%} over 2000 steps); after step 3000: {samples[-1] / 2**20:.1f} MiB "
        f"({samples[-1] / warm - 1:+.2%})")
  assert samples[-1] <= warm * 1.10, [round(s / 2**20) for s in samples]


def last_step(output):
  return max(int(s) for s in re.findall(r"step (\d+)/", output))


@pytest.mark.e2e
def test_kill_9_at_several_points_then_rerun_ends_bit_identical_to_an_uninterrupted_run(tmp_path):
  """Three kill -9s (mid-interval, right after a save, 50 ms after one); each rerun resumes from the last checkpoint."""
  steps = ["--config.train.steps=300"]
  reference = run_command([PY, "main.py", *EXACT, *steps, f"--workdir={tmp_path / 'ref'}"], env=env(), timeout=300)
  assert reference.returncode == 0, reference.stderr[-3000:]
  workdir = tmp_path / "killed"
  command = [PY, "main.py", *EXACT, *steps, f"--workdir={workdir}"]
  restored, lost = 0, []
  # the first kill mid-interval, once the asynchronous save of step 20 is written (a busy machine may lag it)
  kills = [([r"saved checkpoint .*ckpt-20\b", r"step (3[5-9]|[4-9]\d)/"], 0.0), (r"saved checkpoint .*ckpt-80\b", 0.0),
           (r"saved checkpoint .*ckpt-(1[4-9]|2[0-4])0\b", 0.05)]
  for pattern, delay in kills:
    output = run_until(command, pattern, delay=delay)
    if restored:
      assert f"restored {workdir}/checkpoints/ckpt-{restored}" in output
    saved = saved_step(workdir)
    assert saved > restored  # every life made progress
    lost.append(last_step(output) - saved)
    restored = saved
  final = run_command(command, env=env(), timeout=300)
  assert final.returncode == 0, final.stderr[-3000:]
  assert f"restored {workdir}/checkpoints/ckpt-{restored}" in final.stderr
  print(f"steps lost per kill (last step logged - step resumed from): {lost}")
  # at most two checkpoint intervals plus one call: an asynchronous save may still be in flight at the kill
  assert all(0 <= n < 2 * 20 + 5 for n in lost), lost
  assert_bit_identical(workdir, tmp_path / "ref")


@pytest.mark.e2e
def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_restorable(tmp_path):
  steps = ["--config.train.steps=60"]
  workdir = tmp_path / "w"
  dying = subprocess.run([PY, os.path.join(REPO, "tests", "fixtures", "die_while_saving.py"), "40", "main.py", *EXACT,
                          *steps, f"--workdir={workdir}"], cwd=REPO, env=env(), capture_output=True, text=True,
                         timeout=300)
  assert dying.returncode == -signal.SIGKILL, dying.stderr[-3000:]
  assert "killing myself while saving" in dying.stderr
  assert saved_step(workdir) == 20  # the index still names the last complete checkpoint
  rerun = run_command([PY, "main.py", *EXACT, *steps, f"--workdir={workdir}"], env=env(), timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert f"restored {workdir}/checkpoints/ckpt-20" in rerun.stderr
  reference = run_command([PY, "main.py", *EXACT, *steps, f"--workdir={tmp_path / 'ref'}"], env=env(), timeout=300)
  assert reference.returncode == 0
  assert_bit_identical(workdir, tmp_path / "ref")


@pytest.mark.e2e
def test_a_corrupt_latest_checkpoint_is_skipped_with_a_warning_and_the_one_before_restored(tiny_digits, tmp_path,
                                                                                            caplog):
  tiny_digits.deterministic, tiny_digits.export = True, False  # compared by checkpoints: no export in 4 runs
  tiny_digits.eval.every_steps, tiny_digits.checkpoint.best_metric = 0, ""
  run.train_and_evaluate(tiny_digits, str(tmp_path / "ref"))  # 20 steps: ckpt-10, ckpt-20
  tiny_digits.train.steps = 10
  run.train_and_evaluate(tiny_digits, str(tmp_path / "w"))
  tiny_digits.train.steps = 20
  run.train_and_evaluate(tiny_digits, str(tmp_path / "w"))  # resumed: ckpt-10, ckpt-20
  data_file = tmp_path / "w" / "checkpoints" / "ckpt-20.data-00000-of-00001"
  corrupt = bytearray(data_file.read_bytes())
  corrupt[len(corrupt) // 2] ^= 0xFF  # one flipped byte: the tensor checksum no longer matches
  data_file.write_bytes(bytes(corrupt))
  with caplog.at_level("INFO"):
    summary = run.train_and_evaluate(tiny_digits, str(tmp_path / "w"))
  assert re.search(r"checkpoint .*ckpt-20 is unreadable \(\w*Error: .*Checksum does not match", caplog.text)
  assert f"restored {tmp_path}/w/checkpoints/ckpt-10" in caplog.text
  assert summary["step"] == 20
  assert (tmp_path / "w" / "checkpoints" / "unreadable" / data_file.name).read_bytes() == bytes(corrupt)  # kept
  assert_bit_identical(tmp_path / "w", tmp_path / "ref")  # steps 11..20 redone exactly; ckpt-20 written anew


@pytest.mark.e2e
def test_a_lost_mwms_worker_stops_the_other_within_seconds_and_the_rerun_resumes_bit_identical(tmp_path):
  from launch.local import cluster_spec

  args = [*EXACT, "--config.train.steps=100", "--config.strategy=multi_worker_mirrored"]
  reference = subprocess.run([PY, "-m", "launch.local", "--workers=2", "--", PY, "main.py", *args,
                              f"--workdir={tmp_path / 'ref'}"], cwd=REPO, env=env(), capture_output=True, text=True,
                             timeout=400)
  assert reference.returncode == 0, reference.stdout[-3000:]
  workdir = tmp_path / "w"
  spec = cluster_spec(2)
  workers = []
  for index in range(2):
    task_env = {**env(), "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": "worker", "index": index}})}
    workers.append(subprocess.Popen([PY, "main.py", *args, f"--workdir={workdir}"], cwd=REPO, env=task_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  try:
    for line in workers[0].stdout:
      if re.search(r"saved checkpoint .*ckpt-40", line):
        break
    workers[1].kill()
    killed_at = time.monotonic()
    rest, _ = workers[0].communicate(timeout=120)
    waited = time.monotonic() - killed_at
  finally:
    for worker in workers:
      if worker.poll() is None:
        worker.kill()
  assert workers[0].returncode == 143, rest[-3000:]  # restartable: Kubernetes' ExitCode policy retries >= 128
  assert waited < 60, waited
  last = rest.strip().splitlines()[-1]
  assert re.match(r"error: lost process /job:worker/(replica:0/)?task:1 during training near step \d+ "
                  r"\((Unavailable|DeadlineExceeded|Aborted|Cancelled)Error: .*\); this process stops\. Rerun the whole "
                  rf"job to resume from {workdir}/checkpoints/ckpt-\d+$", last), last
  assert "Traceback" not in rest
  resumed = subprocess.run([PY, "-m", "launch.local", "--workers=2", "--", PY, "main.py", *args,
                            f"--workdir={workdir}"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=400)
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert re.search(rf"\[worker:1\].*restored {workdir}/checkpoints/ckpt-\d+", resumed.stdout)
  assert_bit_identical(workdir, tmp_path / "ref")


@pytest.mark.e2e
def test_sigterm_to_the_parameter_server_coordinator_saves_exits_143_and_the_rerun_resumes(tmp_path):
  workdir = tmp_path / "ps"
  command = [PY, "-m", "launch.local", "--workers=2", "--ps=1", "--", PY, "main.py", *LONG, f"--workdir={workdir}",
             "--config.strategy=parameter_server"]

  code, output = start_and_sigterm(command, launched_pid("chief:0"), tmp_path, wait_for=r"\[chief:0\].*step \d+/")
  assert code == 143, output[-3000:]
  assert re.search(r"\[chief:0\].*preempted \(SIGTERM\): checkpoint saved; exiting with code 143", output)
  resume_for_20_more_steps(command, workdir)


@pytest.mark.parametrize("message, peer, reason", [
    ("Graph execution error:\n\nCollective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error "
     "information from remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:",
     "/job:worker/replica:0/task:1", "Collective ops is aborted by: recvmsg:Connection reset by peer"),
    ("{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} Collective ops "
     "is aborted by: Error reported from /job:worker/task:2: The following tasks are unhealthy (stopped sending "
     "heartbeats):\n/job:worker/replica:0/task:2", "/job:worker/task:2",
     "Collective ops is aborted by: Error reported from /job:worker/task:2: The following tasks are unhealthy "
     "(stopped sending heartbeats): /job:worker/replica:0/task:2"),
    ("Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped "
     "sending heartbeats):\n/job:worker/replica:0/task:1\n/job:worker/replica:0/task:3\nAdditional GRPC error information",
     "/job:worker/task:1", "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks "
     "are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1, /job:worker/replica:0/task:3"),
])
def test_a_lost_worker_message_names_the_peer_not_this_tasks_device(message, peer, reason):
  from loops.distribute.execution import worker_lost
  error = worker_lost(tf.errors.UnavailableError(None, None, message), 40, "/w/checkpoints/ckpt-40")
  assert str(error) == (f"lost process {peer} during training near step 40 (UnavailableError: {reason}); this process "
                        "stops. Rerun the whole job to resume from /w/checkpoints/ckpt-40")
