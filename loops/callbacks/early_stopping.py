"""EarlyStopping: stop when an eval result has not improved for `patience` evals; its state survives resume."""

import math

import tensorflow as tf

from loops.core.interfaces import Callback


def _variable(value, dtype):
  return tf.Variable(value, dtype=dtype, trainable=False)


class EarlyStopping(Callback):
  """Stops the run when `metric` has not improved by more than min_delta for `patience` evals in a row.

  Its best value, the step of it and the evals since are `checkpointed` (callbacks/early_stopping), so the count
  survives preemption and resume; a run it stopped, continued to a greater length, has `patience` evals anew.

  Args:
    metric, mode, patience, min_delta: early_stopping.* of the config.
    variable: fn(value, dtype) -> a variable (tests pass plain holders).
  """

  state_key = "early_stopping"

  def __init__(self, metric, mode, patience, min_delta, variable=_variable):
    self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, min_delta
    self.checkpointed = {"best": variable(math.nan, tf.float64), "best_step": variable(-1, tf.int64),
                         "evals_since": variable(0, tf.int64)}

  READS = ("early_stopping",)

  @classmethod
  def for_run(cls, run, stopping):
    return cls(stopping.metric, stopping.mode, stopping.patience, stopping.min_delta) if stopping.metric else None

  def on_train_begin(self, state):
    if int(self.checkpointed["evals_since"].numpy()) >= self.patience:  # a run it stopped, continued: patience anew
      self.checkpointed["evals_since"].assign(0)

  def after_eval(self, state):
    v = self.checkpointed
    value, best = state.eval[self.metric], float(v["best"].numpy())
    margin = value - best if self.mode == "max" else best - value
    if math.isnan(best) or margin > self.min_delta:
      v["best"].assign(value)
      v["best_step"].assign(state.step)
      v["evals_since"].assign(0)
    else:
      v["evals_since"].assign_add(1)
    evals = int(v["evals_since"].numpy())
    if evals >= self.patience:
      state.request_stop(f"early stopping: {self.metric} did not improve by more than {self.min_delta} in "
                         f"{evals} evals (best {float(v['best'].numpy()):.4g} at step "
                         f"{int(v['best_step'].numpy())})")

  def on_train_end(self, state):
    state.summary["early_stopping_best"] = float(self.checkpointed["best"].numpy())
    state.summary["early_stopping_best_step"] = int(self.checkpointed["best_step"].numpy())
