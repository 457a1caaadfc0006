"""The saving phase's callbacks: checkpoints (and the memory of an early stop), the export, summary.json."""

import json
import posixpath
import time

from absl import logging
import tensorflow as tf

from loops import modeling
from loops.callbacks import format_values
from loops.triggers import Trigger


class Checkpointing:
  """Every checkpoint.every_steps and at the end; every task takes part (non-chief tasks into scratch dirs).

  A run that stopped early keeps its length in the checkpoint (`stopped_total_steps`): rerunning it does not
  train further unless the length was raised.
  """

  def __init__(self, checkpoints, every_steps, stopped_total_steps):
    self.checkpoints, self.trigger, self.stopped_total_steps = checkpoints, Trigger(every_steps), stopped_total_steps

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
      self.checkpoints.save(state.step)
    state.summary["checkpoint"] = self.checkpoints.latest()


def previous_stop_reason(workdir):
  """The "stopped_early" reason of the summary.json an earlier run wrote, if it can be read."""
  try:
    with tf.io.gfile.GFile(posixpath.join(workdir, "summary.json")) as f:
      return json.load(f).get("stopped_early") or "stopped early"
  except (tf.errors.OpError, OSError, ValueError):
    return "stopped early"


class Export:
  """At the end: workdir/export/model.keras (chief), when config.export is set: the logits of the model, with
  the averaged weights under optimizer.ema_decay (`weights_context`)."""

  def __init__(self, model, enabled, weights_context):
    self.model, self.enabled, self.weights_context = model, enabled, weights_context

  def on_train_end(self, state):
    path = None
    if self.enabled:
      with self.weights_context():
        path = state.writer.save_model(modeling.logits_model(self.model), "export/model.keras")
    if path:
      state.writer.info("exported %s", path)
    state.summary["export"] = path


class RunSummary:
  """Last of all: summary.json (chief) and the return value of train_and_evaluate, in state.summary."""

  def __init__(self, plan, wall_started):
    self.plan, self.wall_started = plan, wall_started

  def on_train_end(self, state):
    summary = {"step": state.step, "total_steps": state.total_steps, **state.train, **state.eval,
               "replicas": self.plan.replicas, "global_batch_size": self.plan.global_batch_size,
               "learning_rate": self.plan.learning_rate, "wall_seconds": time.perf_counter() - self.wall_started,
               **state.summary}
    if state.stop_reason:
      summary["stopped_early"] = state.stop_reason
    state.summary.clear()
    state.summary.update(summary)
    state.writer.write_json("summary.json", summary)
    state.writer.info("done: %s", format_values(summary))
    if state.step != state.start_step:
      epoch_time = summary.get("mean_epoch_seconds_excluding_first")
      state.writer.info("throughput: %.0f images/s over %d steps (%d replica(s)), %s per epoch excluding the first",
                        summary["examples_per_sec"], state.step - state.start_step, self.plan.replicas,
                        f"{epoch_time:.2f} s" if epoch_time else "n/a (fewer than 2 whole epochs)")
    logging.flush()
