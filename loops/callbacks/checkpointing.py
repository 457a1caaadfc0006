"""Checkpointing: every checkpoint.every_steps and at the end; the memory of an early stop."""

import json
import posixpath

import tensorflow as tf

from loops.core.interfaces import Callback
from loops.core.loop import Trigger


class Checkpointing(Callback):
  """Every checkpoint.every_steps and at the end; every task takes part (non-chief tasks into scratch dirs).
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

  @classmethod
  def for_run(cls, run):
    return cls(run.checkpoints, run.config.checkpoint.every_steps)

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


def previous_stop_reason(workdir):
  """The "stopped_early" reason of the summary.json an earlier run wrote, if it can be read."""
  try:
    with tf.io.gfile.GFile(posixpath.join(workdir, "summary.json")) as f:
      return json.load(f).get("stopped_early") or "stopped early"
  except (tf.errors.OpError, OSError, ValueError):
    return "stopped early"
