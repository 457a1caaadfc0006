"""checkpoint.async_save: asynchronous periodic saves write the same checkpoints as blocking ones; the final, best
and preemption saves are complete when the process exits; kill -9 during an asynchronous write leaves the previous
checkpoint restorable and the rerun resumes and finishes (tests/fixtures/slow_async_writes.py holds writes open)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from loops import run
from loops.persist import checkpoints as checkpoints_lib
from tests.conftest import REPO, load_config

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
  """{name: array} of every tensor of the checkpoint at `path` but TensorFlow's bookkeeping: the object graph,
  save_counter and the preemption handler's checkpointed_runs (TensorFlow's asynchronous writer saves through a
  checkpoint object of its own, made of the model, optimizer, step and run variables only)."""
  reader = tf.train.load_checkpoint(path)
  names = [n for n in reader.get_variable_to_dtype_map()
           if not any(k in n for k in ("OBJECT_GRAPH", "save_counter", "checkpointed_runs"))]
  return {n: reader.get_tensor(n) for n in names}


def assert_same_tensors(path, reference):
  got, want = tensors(path), tensors(reference)
  assert sorted(got) == sorted(want) and len(want) > 10
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=f"{path}: {name}")


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
  """The same deterministic digits run with blocking and with asynchronous saves: {mode: (workdir, {step: name of
  the thread that logged "saved checkpoint .../ckpt-STEP"})}."""
  import logging
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
    runs[mode] = workdir, {int(message.rsplit("-", 1)[1]): thread for message, thread in saved if "/checkpoints/" in message}
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
