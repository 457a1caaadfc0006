"""The local launcher, with stand-in commands (fast) and with real multi-worker training."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from launch import local
from loops import run
from tests.conftest import REPO, load_config, run_command
from tests.test_sidecar import event_scalars

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

PY = sys.executable

VERDICT = re.compile(r"\[launch\] \S+ (died|failed|was preempted)")  # a process's end, as launch.local says it


def test_cluster_spec_uses_distinct_loopback_ports_and_a_chief_only_with_ps():
  spec = local.cluster_spec(2)
  assert list(spec) == ["worker"] and len(set(spec["worker"])) == 2
  assert all(a.startswith("127.0.0.1:") for a in spec["worker"])
  spec = local.cluster_spec(2, ps=1)
  assert {k: len(v) for k, v in spec.items()} == {"chief": 1, "worker": 2, "ps": 1}


def test_each_task_gets_its_tf_config_and_prefixed_output():
  out = io.StringIO()
  code, failed = local.launch([PY, "-c", "import os; print(os.environ['TF_CONFIG'])"], workers=2, out=out)
  assert (code, failed) == (0, None)
  lines = [l for l in out.getvalue().splitlines() if not l.startswith("[launch]")]
  by_task = {l.split("] ")[0][1:]: json.loads(l.split("] ", 1)[1]) for l in lines}
  assert sorted(by_task) == ["worker:0", "worker:1"]
  assert by_task["worker:1"]["task"] == {"type": "worker", "index": 1}
  assert by_task["worker:0"]["cluster"] == by_task["worker:1"]["cluster"]


def test_a_failing_task_stops_the_others_and_is_named():
  script = ("import json, os, sys, time\n"
            "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
            "if task['index'] == 1: time.sleep(0.5); sys.exit(3)\n"
            "print(os.getpid(), flush=True); time.sleep(120)\n")
  out = io.StringIO()
  started = time.monotonic()
  code, failed = local.launch([PY, "-c", script], workers=2, out=out)
  assert (code, failed) == (3, "worker:1")
  assert time.monotonic() - started < 30
  assert "[launch] worker:1 failed (exit code 3); stopped the other processes" in out.getvalue()
  survivor = int(re.search(r"\[worker:0\] (\d+)", out.getvalue()).group(1))
  with pytest.raises(ProcessLookupError):
    os.kill(survivor, 0)


def test_ctrl_c_to_the_launcher_stops_every_process_and_says_so_not_failed(monkeypatch):
  """It said '[launch] launcher (interrupted) failed (exit code 130)': nothing failed; every process got SIGTERM."""
  monkeypatch.setattr(local, "_watch", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
  out = io.StringIO()
  code, failed = local.launch([PY, "-c", "import time; print('up', flush=True); time.sleep(120)"], workers=2, out=out)
  assert (code, failed) == (130, local.INTERRUPTED)
  assert out.getvalue().splitlines()[-1] == ("[launch] interrupted (Ctrl-C): stopped every process with SIGTERM (each "
                                             "saves a checkpoint and exits); rerun the same command to resume")


def launch_main(workers, *overrides, timeout=400):
  return subprocess.run(
      [PY, "-m", "launch.local", f"--workers={workers}", "--", PY, "main.py", "--config=configs/digits_cnn.py",
       "--config.strategy=multi_worker_mirrored", *overrides],
      cwd=REPO, capture_output=True, text=True, timeout=timeout, env={k: v for k, v in os.environ.items()
                                                                        if k != "TF_CONFIG"})


def test_two_worker_mwms_computes_the_weights_of_two_mirrored_replicas(tiny_digits, tmp_path):
  """20 steps, fixed seed, determinism on. Momentum 0: with momentum, rounding differences between the two
  ways of splitting the global batch (halves vs even/odd examples) grow chaotically after ~7 steps."""
  overrides = ["--config.train.epochs=None", "--config.train.steps=20", "--config.train.steps_per_loop=5",
               "--config.optimizer.momentum=0.0", "--config.deterministic=True"]
  result = launch_main(2, f"--workdir={tmp_path / 'mwms'}", *[o for o in overrides if "epochs" not in o])
  assert result.returncode == 0, result.stdout[-3000:]
  tiny_digits.strategy, tiny_digits.cpu_replicas = "mirrored", 2
  tiny_digits.optimizer.momentum = 0.0
  tiny_digits.eval.every_steps = tiny_digits.checkpoint.every_steps = 0
  run.train_and_evaluate(tiny_digits, str(tmp_path / "mirrored"))
  readers = [tf.train.load_checkpoint(str(tmp_path / d / "checkpoints")) for d in ("mwms", "mirrored")]
  keys = [k for k in readers[0].get_variable_to_shape_map() if "_trainable_variables" in k]
  assert len(keys) == 8
  for key in keys:
    np.testing.assert_allclose(readers[0].get_tensor(key), readers[1].get_tensor(key), rtol=1e-5, atol=1e-7,
                               err_msg=key)
  summaries = [json.load(open(tmp_path / d / "summary.json")) for d in ("mwms", "mirrored")]
  for tag in ("train/loss", "train/accuracy"):  # the last call's metrics, summed over both workers
    assert summaries[0][tag] == pytest.approx(summaries[1][tag], rel=1e-4), tag
  # the serving signature takes float32 pixels as stored (0..16 for digits)
  images = tf.constant(np.random.default_rng(0).integers(0, 17, (8, 8, 8, 1)), tf.float32)
  served = [tf.saved_model.load(summary["export"]["saved_model"]).signatures["serving_default"](images=images)
            for summary in summaries]  # the chief's serving export is the mirrored run's
  np.testing.assert_allclose(served[0]["probabilities"], served[1]["probabilities"], atol=1e-5)


def test_a_task_killed_by_a_signal_is_a_lost_worker_and_the_job_exits_with_the_preemption_code(tmp_path):
  """Worker 1 dies of SIGKILL; worker 0, like a real MWMS peer, then exits with the preemption code (99 here, read
  from the command). The launcher names the killed task, not the one it brought down, and exits 99."""
  script = ("import json, os, signal, sys, time\n"
            "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
            f"pid_file = {str(tmp_path / 'pid')!r}\n"
            "if index == 1:\n"
            "  open(pid_file, 'w').write(str(os.getpid())); time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)\n"
            "while not os.path.exists(pid_file): time.sleep(0.05)\n"
            "stat = f'/proc/{open(pid_file).read()}/stat'\n"
            "while os.path.exists(stat) and open(stat).read().split(')')[1].split()[0] != 'Z': time.sleep(0.05)\n"
            "sys.exit(99)\n")
  out = io.StringIO()
  code, failed = local.launch([PY, "-c", script, "--config.preemption.exit_code=99"], workers=2, out=out)
  assert (code, failed) == (99, "worker:1")
  verdicts = [line for line in out.getvalue().splitlines() if VERDICT.match(line)]
  assert verdicts == ["[launch] worker:1 died of signal 9 (SIGKILL): a lost worker; stopped the other processes; "
                      "exit code 99: rerun to resume from the last checkpoint"]


def test_a_task_that_aborts_is_named_with_its_fatal_line_and_the_frame_it_died_in():
  """A failed CHECK in TensorFlow prints a glog F-line and aborts; faulthandler (absl's app.run enables it) prints
  the Python stack. The launcher repeats both after its verdict, where a log's tail shows them."""
  script = ("import faulthandler, json, os, sys, time\n"
            "faulthandler.enable()\n"
            "def stop_trace():\n"
            "  print('F1127 00:32:16.760236  4242 profiler_session.cc:95] Check failed: ok', file=sys.stderr, "
            "flush=True)\n"
            "  os.abort()\n"
            "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1: time.sleep(0.3); stop_trace()\n"
            "time.sleep(120)\n")
  out = io.StringIO()
  code, failed = local.launch([PY, "-c", script], workers=2, out=out)
  assert (code, failed) == (143, "worker:1")
  lines = out.getvalue().splitlines()
  assert lines[-2].startswith("[launch] worker:1 died of signal 6 (SIGABRT): a lost worker")
  assert lines[-1] == ("[launch] worker:1 died saying: F1127 00:32:16.760236  4242 profiler_session.cc:95] Check "
                       'failed: ok; in File "<string>", line 5 in stop_trace')


def test_last_words_are_none_for_a_task_that_printed_no_fatal_line():
  words = local.LastWords()
  for line in ("I1127 00:32:16.760236  4242 writers.py:178] step 16/24\n", "Thread 0x00007f (most recent call "
               "first):\n", '  File "x.py", line 3 in wait\n'):
    words.see(line)
  assert str(words) == ""


def test_killing_a_worker_mid_run_exits_143_naming_it_and_the_rerun_resumes(tmp_path):
  """kill -9 of one MWMS worker after the first checkpoint: the launcher stops the other, exits 143 with one line
  naming the killed task, and the same command run again restores that checkpoint and trains to the end."""
  command = [PY, "-m", "launch.local", "--workers=2", "--", PY, "main.py", "--config=configs/digits_cnn.py",
             "--config.strategy=multi_worker_mirrored", "--config.train.steps=300", "--config.train.steps_per_loop=10",
             "--config.checkpoint.every_steps=20", "--config.eval.every_steps=0", "--config.export=False",
             f"--workdir={tmp_path}"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  pids, lines = {}, []
  try:
    for line in proc.stdout:
      lines.append(line)
      started = re.match(r"\[launch\] (\S+) started \(pid (\d+)\)", line)
      if started:
        pids[started.group(1)] = int(started.group(2))
      if re.search(r"\[worker:0\].*step \d+/", line) and list(tmp_path.glob("checkpoints/ckpt-*.index")):
        break
    killed_at = time.monotonic()
    os.kill(pids["worker:1"], signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 143, "".join(lines)[-2000:] + rest[-3000:]
  assert time.monotonic() - killed_at < 60
  verdicts = [line for line in rest.splitlines() if VERDICT.match(line)]
  assert verdicts == ["[launch] worker:1 died of signal 9 (SIGKILL): a lost worker; stopped the other processes; "
                      "exit code 143: rerun to resume from the last checkpoint"]
  for pid in pids.values():
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
  saved = max(int(p.name[len("ckpt-"):-len(".index")]) for p in tmp_path.glob("checkpoints/ckpt-*.index"))
  assert 0 < saved < 300
  rerun = run_command(command, env=env, timeout=400)
  assert rerun.returncode == 0, rerun.stdout[-3000:]
  restored = re.search(r"\[worker:0\].*restored \S*ckpt-(\d+)", rerun.stdout)
  assert restored and 0 < int(restored.group(1)) <= saved, rerun.stdout[-3000:]
  assert json.load(open(tmp_path / "summary.json"))["step"] == 300


def test_parameter_server_with_two_workers_and_one_ps_trains_digits(tmp_path):
  result = subprocess.run(
      [PY, "-m", "launch.local", "--workers=2", "--ps=1", "--", PY, "main.py", "--config=configs/digits_cnn.py",
       "--config.strategy=parameter_server", f"--workdir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=400,
      env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
  assert result.returncode == 0, result.stdout[-3000:]
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["step"] == 1100 and summary["eval/accuracy"] >= 0.90
  # the train metrics the coordinator sums from each step's one vector: a mean loss, and a share of rows that rises
  accuracy = event_scalars(str(tmp_path), "train/accuracy")
  assert 0.0 < summary["train/loss"] < 0.5 and len(accuracy) == 22, (summary, accuracy)
  assert all(0.0 <= a <= 1.0 for a in accuracy.values()) and min(accuracy.values()) < 0.99, accuracy
  assert os.path.isfile(os.path.join(summary["export"]["saved_model"], "saved_model.pb"))
  assert "[chief:0]" in result.stdout and "[worker:1]" in result.stdout and "[ps:0]" in result.stdout


def test_a_launcher_killed_with_sigkill_takes_its_tasks_down_and_they_save_first(tmp_path):
  """The tasks get SIGTERM from the kernel when launch.local dies however it dies: a preemption save, no orphan
  training on."""
  workdir = tmp_path / "w"
  launcher = subprocess.Popen(
      [sys.executable, "-m", "launch.local", "--workers=1", "--", sys.executable, "main.py",
       "--config=configs/digits_cnn.py", "--config.train.epochs=2000", "--config.train.steps_per_loop=10",
       "--config.checkpoint.every_steps=0", "--config.summary.progress_bar=off", f"--workdir={workdir}"],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
  output = []
  for line in launcher.stdout:
    output.append(line)
    if re.search(r"\[worker:0\].*step \d+/", line):
      break
  task = int(re.search(r"\[launch\] worker:0 started \(pid (\d+)\)", "".join(output)).group(1))
  os.kill(launcher.pid, signal.SIGKILL)
  launcher.wait()
  for _ in range(240):
    if not os.path.exists(f"/proc/{task}") or open(f"/proc/{task}/stat").read().split()[2] == "Z":
      break
    time.sleep(0.5)
  else:
    os.kill(task, signal.SIGKILL)
    pytest.fail("the task trained on after its launcher was killed")
  saved = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
  assert saved and int(saved.rsplit("-", 1)[1]) > 0  # checkpoint.every_steps=0: only the preemption save
