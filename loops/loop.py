"""The outer loop: a short sequence of calls to an execution and to callbacks. Pure Python: no TensorFlow.

One iteration: train one call (shortened to end on the next due boundary), `after_train_call`, evaluate when
due and `after_eval`, `on_call_end` (the saving phase: preemption, checkpoints), then every task agrees whether
anyone asked to stop. At the end: a final eval (unless one just ran at this step) and `on_train_end`.
"""

import dataclasses
import time
import types

from loops.triggers import Trigger, call_length

HOOKS = ("on_train_begin", "after_train_call", "after_eval", "on_call_end", "on_train_end")


@dataclasses.dataclass(frozen=True)
class TrainOutput:
  """What one train call returns: the step reached, its `train/...` scalars, and whether its loss was finite."""
  step: int
  results: dict
  finite: bool


class State:
  """What callbacks see. The loop's values are read-only properties; a callback acts through
  `request_stop(reason)`, `writer` (TensorBoard scalars, chief only) and `summary` (extra summary.json values)."""

  def __init__(self, *, step, total_steps, steps_per_epoch, is_chief, workdir, writer, config=None):
    self._step = self._start_step = self._call_start_step = step
    self._total_steps, self._steps_per_epoch = total_steps, steps_per_epoch
    self._is_chief, self._workdir, self._writer, self._config = is_chief, workdir, writer, config
    self._train, self._eval, self._eval_step = {}, {}, None
    self._call_seconds = 0.0
    self._stop_reason = None
    self.summary = {}

  step = property(lambda self: self._step)
  start_step = property(lambda self: self._start_step, doc="The step this process started (or resumed) at.")
  call_start_step = property(lambda self: self._call_start_step, doc="The step before the last train call.")
  total_steps = property(lambda self: self._total_steps)
  steps_per_epoch = property(lambda self: self._steps_per_epoch)
  epoch = property(lambda self: self._step / self._steps_per_epoch, doc="Epochs done (fractional).")
  train = property(lambda self: types.MappingProxyType(self._train), doc="The last call's train/... scalars.")
  eval = property(lambda self: types.MappingProxyType(self._eval), doc="The latest eval/... results ({} before).")
  eval_step = property(lambda self: self._eval_step, doc="The step of the latest eval, or None.")
  call_seconds = property(lambda self: self._call_seconds, doc="Wall time of the last train call.")
  is_chief = property(lambda self: self._is_chief)
  workdir = property(lambda self: self._workdir)
  writer = property(lambda self: self._writer)
  config = property(lambda self: self._config)
  stop_reason = property(lambda self: self._stop_reason, doc="Why the run stops early, or None.")

  def request_stop(self, reason):
    """Stops the run at the end of the current call (the first reason given is kept)."""
    if not self._stop_reason:
      self._stop_reason = str(reason) or "stop requested"


class CallbackList:
  """Dispatches each hook to the callbacks that have it, in their fixed order."""

  def __init__(self, callbacks):
    self.callbacks = list(callbacks)

  def dispatch(self, hook, state):
    for callback in self.callbacks:
      method = getattr(callback, hook, None)
      if method is not None:
        method(state)

  def triggers(self):
    return [c.trigger for c in self.callbacks if isinstance(getattr(c, "trigger", None), Trigger)]


class Loop:
  """Sequences an execution (train k steps, evaluate, rewind, agree on a stop) and callbacks; see the module doc."""

  def __init__(self, execution, callbacks, state, *, steps_per_loop, eval_every_steps, nan_guard,
               clock=time.perf_counter):
    self.execution, self.callbacks, self.state = execution, CallbackList(callbacks), state
    self.steps_per_loop, self.nan_guard, self.clock = steps_per_loop, nan_guard, clock
    self.eval_trigger = Trigger(eval_every_steps)
    self.triggers = [self.eval_trigger, *self.callbacks.triggers()]

  def run(self):
    state = self.state
    self.callbacks.dispatch("on_train_begin", state)
    while state.step < state.total_steps and not state.stop_reason:
      if not self._train_call():
        continue  # rolled back: the call's results are discarded
      if self.eval_trigger.due(state.call_start_step, state.step):
        self._evaluate()
      self.callbacks.dispatch("on_call_end", state)
      state._stop_reason = self.execution.agree_on_stop(state.stop_reason)
    if state.eval_step != state.step:
      self._evaluate()
    self.callbacks.dispatch("on_train_end", state)
    return state

  def _train_call(self):
    state = self.state
    num_steps = call_length(state.step, state.total_steps, self.steps_per_loop, self.triggers)
    started = self.clock()
    output = self.execution.train(num_steps)
    state._call_seconds = self.clock() - started
    state._call_start_step, state._step, state._train = state.step, output.step, dict(output.results)
    if not output.finite:
      state._step = self.nan_guard.recover(state)
      return False
    self.callbacks.dispatch("after_train_call", state)
    return True

  def _evaluate(self):
    state = self.state
    state._eval, state._eval_step = dict(self.execution.evaluate()), state.step
    self.callbacks.dispatch("after_eval", state)


class NanGuard:
  """nan_policy: `stop` raises naming the steps; `rollback` restores the last checkpoint, rewinds the input to its
  step and retries, at most max_retries times. checkpoints: latest() / save(step) / restore_latest() -> path."""

  def __init__(self, mode, max_retries, checkpoints, execution, log=None):
    self.mode, self.max_retries = mode, max_retries
    self.checkpoints, self.execution, self.log = checkpoints, execution, log
    self.rollbacks = 0

  def on_train_begin(self, state):
    state.summary["nan_rollbacks"] = 0
    if self.mode == "rollback" and self.checkpoints.latest() is None:
      self.checkpoints.save(state.step)  # something to roll back to

  def recover(self, state):
    """Called after a call whose loss was not finite; returns the step training continues from."""
    first, last = state.call_start_step + 1, state.step
    if self.mode == "stop" or self.rollbacks >= self.max_retries:
      retried = f" after {self.rollbacks} rollback(s)" if self.rollbacks else ""
      raise FloatingPointError(f"non-finite loss in steps {first}..{last}{retried} (nan_policy.mode={self.mode})")
    self.rollbacks += 1
    state.summary["nan_rollbacks"] = self.rollbacks
    restored = self.checkpoints.restore_latest()
    step = self.execution.step
    self.execution.rewind(step)
    if self.log:
      self.log(f"non-finite loss in steps {first}..{last}: rolled back to {restored} (step {step}), "
               f"rollback {self.rollbacks} of {self.max_retries}")
    return step
