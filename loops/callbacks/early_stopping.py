"""EarlyStopping: stop when an eval result has not improved for `patience` evals; its state survives resume."""

import math

from loops.core.interfaces import Callback


class EarlyStopping(Callback):
  """Stops the run when `metric` has not improved by more than min_delta for `patience` evals in a row.

  Args:
    metric, mode, patience, min_delta: early_stopping.* of the config.
    variables: RunVariables (loops/build.py): best, best_step, evals_since, checkpointed with the model, so the
      count survives preemption and resume.
  """

  def __init__(self, metric, mode, patience, min_delta, variables):
    self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, min_delta
    self.variables = variables

  def after_eval(self, state):
    v = self.variables
    value, best = state.eval[self.metric], float(v.early_stopping_best.numpy())
    margin = value - best if self.mode == "max" else best - value
    if math.isnan(best) or margin > self.min_delta:
      v.early_stopping_best.assign(value)
      v.early_stopping_best_step.assign(state.step)
      v.early_stopping_evals_since.assign(0)
    else:
      v.early_stopping_evals_since.assign_add(1)
    if int(v.early_stopping_evals_since.numpy()) >= self.patience:
      state.request_stop(f"early stopping: {self.metric} did not improve by more than {self.min_delta} in "
                         f"{self.patience} evals (best {float(v.early_stopping_best.numpy()):.4g} at step "
                         f"{int(v.early_stopping_best_step.numpy())})")

  def on_train_end(self, state):
    state.summary["early_stopping_best"] = float(self.variables.early_stopping_best.numpy())
    state.summary["early_stopping_best_step"] = int(self.variables.early_stopping_best_step.numpy())
