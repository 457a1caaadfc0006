"""Faults with real processes: SIGTERM (preemption) on one_device, mirrored and 2-worker MWMS; NaN guard."""

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
from tests.conftest import REPO, load_config
from tests.test_train import model_weights

PY = sys.executable
FIXTURES = os.path.join(REPO, "tests", "fixtures", "user_losses")
LONG = ["--config=configs/digits_cnn.py", "--config.train.epochs=2000", "--config.train.steps_per_loop=10",
        "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0", "--config.summary.progress_bar=off"]


def env():
  return {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}


def start_and_sigterm(command, target_pattern, tmp_path, wait_for=r"step \d+/"):
  """Starts command, waits for a progress line, SIGTERMs the process whose pid the pattern finds; returns output."""
  proc = subprocess.Popen(command, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line)
      if re.search(wait_for, line):
        break
    pid = target_pattern(proc, "".join(lines))
    os.kill(pid, signal.SIGTERM)
    rest, _ = proc.communicate(timeout=180)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  return proc.returncode, "".join(lines) + rest


def saved_step(workdir):
  return int(tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints")).rsplit("-", 1)[1])


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_sigterm_saves_at_the_current_step_exits_42_and_the_rerun_resumes_there(strategy, tmp_path):
  workdir = tmp_path / "run"
  args = [PY, "main.py", *LONG, f"--workdir={workdir}", f"--config.strategy={strategy}",
          f"--config.cpu_replicas={2 if strategy == 'mirrored' else 0}"]
  code, output = start_and_sigterm(args, lambda proc, _: proc.pid, tmp_path)
  assert code == 42, output[-3000:]
  assert "preempted (SIGTERM): checkpoint saved; exiting with code 42" in output
  step = saved_step(workdir)
  assert step > 0 and step % 10 == 0
  resumed = subprocess.run(args[:-1] + [f"--config.train.steps={step + 20}"] + args[-1:], cwd=REPO, env=env(),
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"restored {workdir}/checkpoints/ckpt-{step}" in resumed.stderr
  assert re.search(rf"step {step + 10}/{step + 20}", resumed.stderr)
  assert json.load(open(workdir / "summary.json"))["step"] == step + 20


def test_sigterm_to_one_mwms_worker_saves_on_all_workers_and_exits_42(tmp_path):
  workdir = tmp_path / "mw"
  command = [PY, "-m", "launch.local", "--workers=2", "--", PY, "main.py", *LONG, f"--workdir={workdir}",
             "--config.strategy=multi_worker_mirrored"]

  def worker1(proc, output):
    return int(re.search(r"\[launch\] worker:1 started \(pid (\d+)\)", output).group(1))

  code, output = start_and_sigterm(command, worker1, tmp_path, wait_for=r"\[worker:0\].*step \d+/")
  assert code == 42, output[-3000:]
  assert re.search(r"\[launch\] task worker:[01] was preempted \(exit code 42, checkpoint saved\)", output)
  for worker in ("worker:0", "worker:1"):  # the signal reached worker 1 only; both saved the same step
    assert re.search(rf"\[{worker}\].*preempted \(SIGTERM\): checkpoint saved", output), output[-3000:]
  assert saved_step(workdir) > 0


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
  return tiny_digits


def test_a_nan_stops_the_run_naming_the_steps(tiny_digits, tmp_path, monkeypatch):
  nan_config(tiny_digits, monkeypatch, "nan_at_call", 8, "stop")  # step 7
  with pytest.raises(FloatingPointError, match=r"non-finite loss in steps 6\.\.10 \(nan_policy.mode=stop\)"):
    run.train_and_evaluate(tiny_digits, str(tmp_path))


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


def test_resident_memory_does_not_grow_over_thousands_of_steps(tiny_digits, tmp_path, monkeypatch):
  """RSS sampled at every train call of a 3 000-step run: the last sample is within 10 % of the one after warm-up."""
  from loops import progress as progress_lib

  samples = []
  record = progress_lib.Progress.record

  def sampling_record(self, step, seconds):
    with open("/proc/self/statm") as f:
      samples.append(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    return record(self, step, seconds)

  monkeypatch.setattr(progress_lib.Progress, "record", sampling_record)
  tiny_digits.train.steps, tiny_digits.train.steps_per_loop, tiny_digits.train.global_batch_size = 3000, 50, 16
  tiny_digits.eval.every_steps, tiny_digits.checkpoint.every_steps = 1000, 1000
  run.train_and_evaluate(tiny_digits, str(tmp_path))
  assert len(samples) == 60
  warm = samples[9]  # after 500 steps, 1 eval-free stretch: tracing and pipeline buffers are in place
  assert samples[-1] <= warm * 1.10, [round(s / 2**20) for s in samples]
