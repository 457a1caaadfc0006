"""nan_policy after a call whose loss was not finite: stop with one line, or roll back and retry. Pure Python."""


class NanGuard:
  """nan_policy: `stop` raises naming the steps; `rollback` restores the last checkpoint (with the callbacks' state
  and this run's learning rates: `checkpoints.roll_back`), rewinds the input to its step and retries, at most
  max_retries times. A callback too (on_train_begin: something to roll back to).

  Args:
    mode: "stop" or "rollback".
    max_retries: rollbacks allowed before a persistent NaN stops the run.
    checkpoints: latest() / save(step) / roll_back() -> path (loops/persist/checkpoints.py).
    execution: the loop's Execution (its step after the restore, and rewind).
    log: fn(message) for the rollback line.
  """

  def __init__(self, mode, max_retries, checkpoints, execution, log=None):
    self.mode, self.max_retries = mode, max_retries
    self.checkpoints, self.execution, self.log = checkpoints, execution, log
    self.rollbacks = 0

  def on_train_begin(self, state):
    state.summary["nan_rollbacks"] = 0
    if self.mode == "rollback" and self.checkpoints.latest() is None:
      self.checkpoints.save(state.step)  # something to roll back to

  def recover(self, state):
    """Called by the loop after a call whose loss was not finite; returns the step training continues from."""
    first, last = state.call_start_step + 1, state.step
    if self.mode == "stop" or self.rollbacks >= self.max_retries:
      retried = f" after {self.rollbacks} rollback(s)" if self.rollbacks else ""
      raise FloatingPointError(f"non-finite loss in steps {first}..{last}{retried} (nan_policy.mode={self.mode})")
    self.rollbacks += 1
    state.summary["nan_rollbacks"] = self.rollbacks
    restored = self.checkpoints.roll_back()
    step = self.execution.step
    self.execution.rewind(step)
    if self.log:
      self.log(f"non-finite loss in steps {first}..{last}: rolled back to {restored} (step {step}), "
               f"rollback {self.rollbacks} of {self.max_retries}")
    return step
