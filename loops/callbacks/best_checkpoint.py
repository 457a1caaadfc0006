"""BestCheckpoint: the checkpoint with the best eval metric, kept in DIR/best with DIR/best/best.json; the
trainer (DIR = the workdir) and the sidecar evaluator (DIR = workdir/eval) share it."""

import contextlib
import json
import posixpath

import tensorflow as tf

from loops.core.interfaces import Callback
from loops.persist import checkpoints as checkpoints_lib

RECORD = "best/best.json"  # under DIR, written by DIR's writer


class BestCheckpoint(Callback):
  """After each eval: saves when results[metric] beats the best so far (every task decides alike: metrics are
  reduced; non-chief tasks save into scratch directories).

  Args:
    directory: where best/ lives (a workdir, or workdir/eval for the sidecar evaluator).
    checkpoint: the run's tf.train.Checkpoint; step_counter: its step variable.
    metric, mode: checkpoint.best_metric ("" = off) and checkpoint.best_mode.
    is_chief: whether this task's saves are the real ones.
    weights_context: fn() -> context in which the model holds the weights that were evaluated (EMA averages).
  """

  def __init__(self, directory, checkpoint, step_counter, metric, mode, is_chief,
               weights_context=contextlib.nullcontext):
    self.metric, self.mode, self.is_chief, self.weights_context = metric, mode, is_chief, weights_context
    self._checkpoints = (checkpoints_lib.Checkpoints(directory, checkpoint, step_counter, 1, is_chief, subdir="best")
                         if metric else None)
    self.value = self.step = None
    record = posixpath.join(directory, RECORD)
    if metric and tf.io.gfile.exists(record):
      with tf.io.gfile.GFile(record) as f:
        saved = json.load(f)
      self.value, self.step = saved["value"], saved["step"]


  @classmethod
  def for_run(cls, run):
    parts, settings = run.parts, run.config.checkpoint
    return cls(run.workdir, parts.checkpoint, parts.step_counter, settings.best_metric, settings.best_mode,
               parts.task.is_chief, run.execution.averaged_weights)

  def update(self, step, results, writer):
    """Saves and writes best.json through `writer` when results[metric] is the best so far; returns the record
    or None."""
    if not self._checkpoints:
      return None
    value = results[self.metric]
    better = self.value is None or (value > self.value if self.mode == "max" else value < self.value)
    if not better or step == self.step:
      return None
    self.value, self.step = value, step
    with self.weights_context():
      self._checkpoints.save(step)
    record = {"metric": self.metric, "value": value, "step": step}
    writer.write_json(RECORD, record)
    return record

  def after_eval(self, state):
    self.update(state.step, state.eval, state.writer)

  def on_train_end(self, state):
    state.summary.update(self.summary())

  def summary(self):
    if not self._checkpoints:
      return {}
    return {"best_metric": self.metric, "best_value": self.value, "best_step": self.step,
            "best_checkpoint": self._checkpoints.latest() if self.is_chief else None}

  def close(self):
    if self._checkpoints:
      self._checkpoints.close()
