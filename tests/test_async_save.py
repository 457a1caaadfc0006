"""checkpoint.async_save: asynchronous periodic saves write the same checkpoints as blocking ones; the final, best
and preemption saves are complete when the process exits; kill -9 during an asynchronous write leaves the previous
checkpoint restorable and the rerun resumes and finishes (tests/fixtures/slow_async_writes.py holds writes open)."""

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from loops import run
from loops.persist import async_saves
from loops.persist import checkpoints as checkpoints_lib
from tests.conftest import REPO, load_config

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

PY = sys.executable
SLOW = os.path.join(REPO, "tests", "fixtures", "slow_async_writes.py")
STEPS = 40
ARGS = ["--config=configs/digits_cnn.py", "--config.deterministic=True", "--config.train.steps_per_loop=5",
        f"--config.train.steps={STEPS}", "--config.eval.every_steps=20", "--config.checkpoint.every_steps=10",
        "--config.summary.progress_bar=off", "--config.export=False"]


def tiny_config(async_save):
  """The config ARGS give (the same steps, cadence and seeds), in-process."""
  c = load_config("digits_cnn")
  c.deterministic, c.train.epochs, c.train.steps, c.train.steps_per_loop = True, None, STEPS, 5
  c.eval.every_steps, c.checkpoint.every_steps, c.checkpoint.async_save = 20, 10, async_save
  c.summary.progress_bar, c.export = "off", False
  return c


def tensors(path):
  """{name: array} of every tensor of the checkpoint at `path` but the object graph and the preemption handler's
  checkpointed_runs (TensorFlow's asynchronous writer saves through a checkpoint object of its own, made of the
  model, optimizer, step and run variables; save_counter is aligned, see Checkpoints._align_async_save_counter)."""
  reader = tf.train.load_checkpoint(path)
  names = [n for n in reader.get_variable_to_dtype_map() if "OBJECT_GRAPH" not in n and "checkpointed_runs" not in n]
  return {n: reader.get_tensor(n) for n in names}


def assert_same_tensors(path, reference, skip=()):
  got, want = tensors(path), tensors(reference)
  for name in [n for n in want if any(s in n for s in skip)]:
    del want[name], got[name]
  assert sorted(got) == sorted(want) and len(want) > 10
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=f"{path}: {name}")


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
  """The same deterministic digits run with blocking and with asynchronous saves: {mode: (workdir, {step: name of
  the thread that logged "saved checkpoint .../ckpt-STEP"})}."""
  runs = {}
  for mode in ("blocking", "async"):
    workdir = str(tmp_path_factory.mktemp(mode))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("absl")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
      run.train_and_evaluate(tiny_config(mode == "async"), workdir)
    finally:
      logger.removeHandler(handler)
      logger.setLevel(old_level)
    saved = [(r.getMessage(), r.threadName) for r in records if r.getMessage().startswith("saved checkpoint")]
    runs[mode] = workdir, {int(message.rsplit("-", 1)[1]): thread for message, thread in saved
                           if "/checkpoints/" in message}
  return runs


def test_async_saves_write_the_same_checkpoints_and_best_checkpoint_as_blocking_saves(both_runs):
  (blocking, blocking_threads), (asynchronous, async_threads) = both_runs["blocking"], both_runs["async"]
  main = "MainThread"
  assert blocking_threads == {10: main, 20: main, 30: main, 40: main}
  # the periodic saves were written by TensorFlow's writer thread; the final one waited (written in this thread)
  assert [async_threads[step] != main for step in (10, 20, 30)] == [True] * 3 and async_threads[40] == main
  for step in (20, 30, 40):  # keep=3
    assert_same_tensors(f"{asynchronous}/checkpoints/ckpt-{step}", f"{blocking}/checkpoints/ckpt-{step}")
  assert tf.train.latest_checkpoint(f"{asynchronous}/checkpoints").endswith(f"ckpt-{STEPS}")
  best = tf.train.latest_checkpoint(f"{asynchronous}/best")
  assert best and os.path.basename(best) == os.path.basename(tf.train.latest_checkpoint(f"{blocking}/best"))
  assert_same_tensors(best, tf.train.latest_checkpoint(f"{blocking}/best"))


def start_slow(tmp_path, seconds, from_step, workdir, *extra):
  """main.py ARGS under slow_async_writes.py (each asynchronous write from checkpoint `from_step` on held `seconds`
  before the index names it); returns (process, marker path)."""
  marker = tmp_path / f"marker-{time.monotonic_ns()}"
  marker.touch()
  command = [PY, SLOW, str(seconds), str(from_step), str(marker), "main.py", *ARGS, *extra, f"--workdir={workdir}"]
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
  return proc, marker


def wait_for_marker(proc, marker, line, timeout=180):
  deadline = time.monotonic() + timeout
  while line not in marker.read_text().splitlines():
    assert proc.poll() is None, f"exited with {proc.returncode} before '{line}': {proc.stdout.read()[-3000:]}"
    assert time.monotonic() < deadline, f"no '{line}' in {marker.read_text()}"
    time.sleep(0.02)


def indexed(workdir):
  """The checkpoints the index of workdir/checkpoints lists (latest last), after asserting each is readable."""
  state = tf.train.get_checkpoint_state(os.path.join(workdir, "checkpoints"))
  paths = list(state.all_model_checkpoint_paths)
  assert state.model_checkpoint_path == paths[-1]
  for path in paths:
    assert checkpoints_lib.unreadable(path) is None, path
  return [int(p.rsplit("-", 1)[1]) for p in paths]


def test_sigterm_during_a_slow_asynchronous_write_waits_for_it_then_saves_the_current_step(tmp_path):
  workdir = tmp_path / "w"
  proc, marker = start_slow(tmp_path, 3, 20, workdir, "--config.train.steps=400", "--config.eval.every_steps=0")
  try:
    wait_for_marker(proc, marker, f"writing {workdir}/checkpoints/ckpt-20")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 143, output[-3000:]
  assert "preempted (SIGTERM): checkpoint saved; exiting with code 143" in output
  assert f"written {workdir}/checkpoints/ckpt-20" in marker.read_text()  # the pending write finished first
  steps = indexed(workdir)
  assert 20 in steps and steps[-1] > 20 and steps[-1] % 5 == 0, steps  # the preemption step is the latest


def test_kill_9_during_asynchronous_writes_keeps_the_previous_checkpoint_and_the_rerun_finishes(tmp_path, both_runs):
  workdir = tmp_path / "w"
  ckpt = f"{workdir}/checkpoints/ckpt-"
  # life 1: killed with ckpt-20's files on disk but not yet in the index; life 2: killed as ckpt-20's write starts
  for moment in (f"written {ckpt}20", f"writing {ckpt}20"):
    proc, marker = start_slow(tmp_path, 60, 20, workdir)
    try:
      wait_for_marker(proc, marker, moment)
    finally:
      os.killpg(proc.pid, signal.SIGKILL)
      output, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert indexed(workdir) == [10], (moment, output[-2000:])
  assert os.path.exists(f"{ckpt}20.index")  # life 1's unindexed files were there: the index never named them
  # life 3: resumes from ckpt-10; its last periodic write (ckpt-30) is held 2 s, so the final save has to wait
  proc, marker = start_slow(tmp_path, 2, 30, workdir)
  output, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, output[-3000:]
  assert f"restored {ckpt}10" in output
  assert f"written {ckpt}30" in marker.read_text()
  assert indexed(workdir) == [20, 30, 40]
  assert checkpoints_lib.unreadable(tf.train.latest_checkpoint(f"{workdir}/best")) is None
  blocking = both_runs["blocking"][0]
  # the interrupted run ends where the uninterrupted one did; save_counter is one less: life 1 saved the best
  # checkpoint of step 20 (best.json), so life 3 did not save it again
  for step in (20, 30, 40):
    assert_same_tensors(f"{ckpt}{step}", f"{blocking}/checkpoints/ckpt-{step}", skip=("save_counter",))


@pytest.mark.parametrize("strategy, async_save, used", [("one_device", True, True), ("mirrored", True, True),
                                                        ("multi_worker_mirrored", True, True),
                                                        ("parameter_server", True, False), ("tpu", True, False),
                                                        ("central_storage", True, False), ("mirrored", False, False)])
def test_async_saves_are_used_only_with_the_strategies_they_are_verified_on(strategy, async_save, used):
  c = tiny_config(async_save)
  c.strategy = strategy
  assert async_saves.async_save_enabled(c.checkpoint.async_save, c.strategy) is used


def test_the_benchmark_measures_both_modes_on_a_small_model(tmp_path):
  from benchmarks import async_save as bench
  checkpoint, step, params = bench.build_checkpoint("digits_cnn", 8, 10)
  warm_up, seconds = bench.measure(checkpoint, step, 2, str(tmp_path))
  assert params > 1000 and len(warm_up["async"]) == 2 and len(warm_up["blocking"]) == 1
  assert {mode: len(values) for mode, values in seconds.items()} == {"blocking": 2, "async": 2, "background": 2}
  for mode in ("blocking", "async"):  # both series wrote their checkpoints, the last of each complete and indexed
    latest = tf.train.latest_checkpoint(str(tmp_path / mode / "checkpoints"))
    assert latest.endswith("ckpt-3") and checkpoints_lib.unreadable(latest) is None
