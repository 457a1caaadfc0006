"""The callbacks that save: `Checkpointing` (every checkpoint.every_steps and at the end; the memory of an early
stop) and `BestCheckpoint` (the checkpoint with the best eval metric). Both ask the run's checkpoints
(loops/persist/checkpoints.py), which do every save."""

import contextlib
import json
import posixpath

import tensorflow as tf

from loops.core.interfaces import Callback
from loops.core.loop import Trigger

BEST_RECORD = "best/best.json"  # under DIR, written by DIR's writer


class Checkpointing(Callback):
  """Every checkpoint.every_steps and at the end; every process takes part (non-chief processes into scratch dirs).
  Periodic saves are asynchronous when the Checkpoints are; the final one waits until it is on disk.

  A run that stopped early keeps its length in the checkpoint (`stopped_total_steps`, checkpointed under
  callbacks/checkpointing): rerunning it does not train further unless the length was raised.

  Args:
    checkpoints: the run's Checkpoints (loops/persist/checkpoints.py).
    every_steps: checkpoint.every_steps (0 = only at the end).
    stopped_total_steps: a variable holding the length of a run that stopped early (0 = it did not); made here
      when None (tests pass plain holders).
  """

  state_key = "checkpointing"

  def __init__(self, checkpoints, every_steps, stopped_total_steps=None):
    if stopped_total_steps is None:
      stopped_total_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.checkpoints, self.trigger, self.stopped_total_steps = checkpoints, Trigger(every_steps), stopped_total_steps
    self.checkpointed = {"stopped_total_steps": stopped_total_steps}

  READS = ("checkpoint",)

  @classmethod
  def for_run(cls, run, checkpoint):
    return cls(run.checkpoints, checkpoint.every_steps)

  def on_train_begin(self, state):
    stopped = int(self.stopped_total_steps.numpy())
    if not stopped:
      return
    if state.total_steps <= stopped:
      reason = previous_stop_reason(state.workdir)
      state.request_stop(reason)
      state.writer.info("this run stopped early at step %d (%s): not training further; raise train.steps or "
                        "train.epochs above %d steps to continue", state.step, reason, stopped)
    else:
      self.stopped_total_steps.assign(0)
      state.writer.info("continuing a run that stopped early at step %d (it was %d steps, now %d)", state.step,
                        stopped, state.total_steps)

  def on_call_end(self, state):
    if self.trigger.due(state.call_start_step, state.step) and state.step < state.total_steps:
      self.checkpoints.save(state.step)  # the last one waits for the final eval (on_train_end)

  def on_train_end(self, state):
    needed = self.checkpoints.last_saved_step != state.step and (
        state.step != state.start_step or self.checkpoints.latest() is None)
    if state.stop_reason and int(self.stopped_total_steps.numpy()) < state.total_steps:
      self.stopped_total_steps.assign(state.total_steps)
      needed = True
    if needed:
      self.checkpoints.save(state.step, wait=True)  # complete (after any pending write) before the run ends
    state.summary["checkpoint"] = self.checkpoints.latest()


class BestCheckpoint(Callback):
  """After each eval: saves when results[metric] beats the best so far, into DIR/best with DIR/best/best.json; the
  trainer (DIR = the workdir) and the sidecar evaluator (DIR = workdir/eval) share it. Every process decides alike
  (metrics are reduced; non-chief processes save into scratch directories).

  Args:
    directory: DIR (a workdir, or workdir/eval for the sidecar evaluator).
    series: DIR/best's checkpoints.Series (None when metric is "").
    metric, mode: checkpoint.best_metric ("" = off) and checkpoint.best_mode.
    is_chief: whether this process's saves are the real ones.
    weights_context: fn() -> context in which the model holds the weights that were evaluated (EMA averages).
  """

  def __init__(self, directory, series, metric, mode, is_chief, weights_context=contextlib.nullcontext):
    self.metric, self.mode, self.is_chief, self.weights_context = metric, mode, is_chief, weights_context
    self._series = series if metric else None
    self.value = self.step = None
    record = posixpath.join(directory, BEST_RECORD)
    if metric and tf.io.gfile.exists(record):
      with tf.io.gfile.GFile(record) as f:
        saved = json.load(f)
      self.value, self.step = saved["value"], saved["step"]

  READS = ("checkpoint",)

  @classmethod
  def for_run(cls, run, checkpoint):
    return cls(run.workdir, run.checkpoints.best, checkpoint.best_metric, checkpoint.best_mode,
               run.parts.role.is_chief, run.execution.averaged_weights)

  def update(self, step, results, writer):
    """Saves and writes best.json through `writer` when results[metric] is the best so far; returns the record
    or None."""
    if not self._series:
      return None
    value = results[self.metric]
    better = self.value is None or (value > self.value if self.mode == "max" else value < self.value)
    if not better or step == self.step:
      return None
    self.value, self.step = value, step
    with self.weights_context():
      self._series.save(step)
    record = {"metric": self.metric, "value": value, "step": step}
    writer.write_json(BEST_RECORD, record)
    return record

  def after_eval(self, state):
    self.update(state.step, state.eval, state.writer)

  def on_train_end(self, state):
    state.summary.update(self.summary())

  def summary(self):
    if not self._series:
      return {}
    return {"best_metric": self.metric, "best_value": self.value, "best_step": self.step,
            "best_checkpoint": self._series.latest() if self.is_chief else None}


def previous_stop_reason(workdir):
  """The "stopped_early" reason of the summary.json an earlier run wrote, if it can be read."""
  try:
    with tf.io.gfile.GFile(posixpath.join(workdir, "summary.json")) as f:
      return json.load(f).get("stopped_early") or "stopped early"
  except (tf.errors.OpError, OSError, ValueError):
    return "stopped early"
