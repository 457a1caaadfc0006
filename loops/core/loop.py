"""The outer loop: a short sequence of calls to an execution and to callbacks. Pure Python: no TensorFlow.

One iteration: train one call (shortened to end on the next due boundary), `after_train_call`, evaluate when
due and `after_eval`, `on_call_end` (the saving phase: preemption, checkpoints), then every process agrees whether
anyone asked to stop. At the end: a final eval (unless one just ran at this step) and `on_train_end`.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import traceback
import types
from typing import Any, Callable, Iterable, Mapping, Optional

from errors import ConfigError, InputPipelineError, first_line
from loops.core.interfaces import HOOKS, Execution


@dataclasses.dataclass(frozen=True)
class Trigger:
  """Due every `every_steps` steps (0 = never), counted from step 0.

  A call that runs from step `prev` to `step` crosses a boundary when prev // n < step // n, so a trigger fires
  once per boundary whatever the calls' lengths (CLU's `step % n == 0` misses boundaries inside a call).
  """
  every_steps: int

  def due(self, prev: int, step: int) -> bool:
    """Whether a call from `prev` to `step` crossed one of the trigger's boundaries."""
    n = self.every_steps
    return n > 0 and prev // n < step // n

  def next_boundary(self, step: int) -> Optional[int]:
    """The first boundary after `step`, or None when the trigger never fires."""
    n = self.every_steps
    return (step // n + 1) * n if n > 0 else None


def call_length(step: int, total_steps: int, steps_per_loop: int, triggers: Iterable[Trigger] = ()) -> int:
  """Steps of the next train call from `step`: up to the next multiple of steps_per_loop, shortened to end on
  the next boundary of any trigger and at total_steps."""
  end = min(total_steps, (step // steps_per_loop + 1) * steps_per_loop)
  for trigger in triggers:
    boundary = trigger.next_boundary(step)
    if boundary is not None:
      end = min(end, boundary)
  return end - step


class State:
  """What callbacks see: the loop's values as read-only properties. A callback acts through `request_stop(reason)`,
  `writer` (TensorBoard scalars, chief only) and `summary` (extra summary.json values). The loop changes the
  values through `update`, the one method that does."""

  FIELDS = ("step", "call_start_step", "train", "eval", "eval_step", "call_seconds", "stop_reason", "worker_seconds")

  def __init__(self, *, step: int, total_steps: int, steps_per_epoch: int, is_chief: bool, workdir: str,
               writer: Any, config: Any = None, models: Any = None):
    self._values = {"step": step, "call_start_step": step, "train": {}, "eval": {}, "eval_step": None,
                    "call_seconds": 0.0, "stop_reason": None, "worker_seconds": ()}
    self._start_step, self._total_steps, self._steps_per_epoch = step, total_steps, steps_per_epoch
    self._is_chief, self._workdir, self._writer, self._config = is_chief, workdir, writer, config
    self._models = types.MappingProxyType(dict(models or {}))
    self.summary = {}

  def update(self, **values: Any) -> None:
    """Sets loop values (the loop's method; callbacks use request_stop). Unknown names raise AttributeError."""
    unknown = set(values) - set(self.FIELDS)
    if unknown:
      raise AttributeError(f"State has no loop value(s) {sorted(unknown)}; valid: {', '.join(self.FIELDS)}")
    self._values.update(values)

  step = property(lambda self: self._values["step"], doc="The global step reached.")
  start_step = property(lambda self: self._start_step, doc="The step this process started (or resumed) at.")
  call_start_step = property(lambda self: self._values["call_start_step"], doc="The step before the last call.")
  total_steps = property(lambda self: self._total_steps)
  steps_per_epoch = property(lambda self: self._steps_per_epoch)
  epoch = property(lambda self: self.step / self._steps_per_epoch, doc="Epochs done (fractional).")
  train = property(lambda self: types.MappingProxyType(self._values["train"]),
                   doc="The last call's train/... scalars.")
  eval = property(lambda self: types.MappingProxyType(self._values["eval"]),
                  doc="The latest eval/... results ({} before the first eval).")
  eval_step = property(lambda self: self._values["eval_step"], doc="The step of the latest eval, or None.")
  call_seconds = property(lambda self: self._values["call_seconds"], doc="Wall time of the last train call.")
  is_chief = property(lambda self: self._is_chief)
  workdir = property(lambda self: self._workdir)
  writer = property(lambda self: self._writer)
  config = property(lambda self: self._config)
  models = property(lambda self: self._models, doc="The task's models by name ({'model': ...} for the built-in).")
  stop_reason = property(lambda self: self._values["stop_reason"], doc="Why the run stops early, or None.")
  worker_seconds = property(lambda self: self._values["worker_seconds"],
                            doc="Each worker's busy seconds in the last call (multi-worker training; else ()).")

  def request_stop(self, reason: str) -> None:
    """Stops the run at the end of the current call (the first reason given is kept).

    Args:
      reason: one line; it ends up in the console and as "stopped_early" in summary.json.
    """
    if not self.stop_reason:
      self.update(stop_reason=str(reason) or "stop requested")


class CallbackList:
  """Dispatches each hook to the callbacks that have it, in their fixed order. An exception a user's callback raises
  (`user`: those objects) becomes one line naming its class, hook, file and line (UserCallbackError)."""

  def __init__(self, callbacks: Iterable[Any], user: Iterable[Any] = ()):
    self.callbacks = list(callbacks)
    self.user = {id(callback) for callback in user}

  def dispatch(self, hook: str, state: State) -> None:
    assert hook in HOOKS, hook
    for callback in self.callbacks:
      method = getattr(callback, hook, None)
      if method is None:
        continue
      try:
        method(state)
      except Exception as error:  # pylint: disable=broad-except
        if id(callback) not in self.user or isinstance(error, ConfigError):
          raise
        raise UserCallbackError(f"callback {type(callback).__name__}.{hook} raised {type(error).__name__}: "
                                f"{first_line(error)}{_where(error, callback)}") from error

  def triggers(self) -> list:
    return [c.trigger for c in self.callbacks if isinstance(getattr(c, "trigger", None), Trigger)]


class Loop:
  """Sequences an execution (train k steps, evaluate, rewind, agree on a stop) and callbacks; see the module doc.

  Args:
    execution: the strategy family's `Execution`.
    callbacks: built-ins and user callbacks, in the order they run.
    state: the `State` the callbacks see.
    steps_per_loop: the longest train call.
    eval_every_steps: evaluate when a call crosses a multiple of it (0: only at the end).
    nan_guard: recover(state) -> the step to continue from, after a call whose loss was not finite.
    user_callbacks: the user's among `callbacks` (an exception they raise is one line naming them).
    on_error: on_error(state) when anything but a train call raised (a callback, an eval): the steps trained
      since the last checkpoint are complete, and can be saved before the error ends the run.
  """

  def __init__(self, execution: Execution, callbacks: Iterable[Any], state: State, *, steps_per_loop: int,
               eval_every_steps: int, nan_guard: Any, clock: Callable[[], float] = time.perf_counter,
               user_callbacks: Iterable[Any] = (), on_error: Optional[Callable[[State], None]] = None):
    self.execution, self.callbacks, self.state = execution, CallbackList(callbacks, user_callbacks), state
    self.steps_per_loop, self.nan_guard, self.clock, self.on_error = steps_per_loop, nan_guard, clock, on_error
    self.in_train_call = False
    self.eval_trigger = Trigger(eval_every_steps)
    self.triggers = [self.eval_trigger, *self.callbacks.triggers()]

  def run(self) -> State:
    """Trains to state.total_steps (or a requested stop); returns the final State."""
    try:
      return self._run()
    except Exception as error:
      if self.on_error is not None and (not self.in_train_call or isinstance(error, InputPipelineError)):
        self.state.update(step=self.execution.step)  # an input failure: the steps of the call before it are done
        self.on_error(self.state)
      raise

  def _run(self) -> State:
    state = self.state
    self.callbacks.dispatch("on_train_begin", state)
    if state.step < state.total_steps and not state.stop_reason:
      self.execution.start_train()
    while state.step < state.total_steps and not state.stop_reason:
      if not self._train_call():
        continue  # rolled back: the call's results are discarded
      if self.eval_trigger.due(state.call_start_step, state.step):
        self._evaluate()
      self.callbacks.dispatch("on_call_end", state)
      state.update(stop_reason=self.execution.agree_on_stop(state.stop_reason))
    if state.eval_step != state.step:
      self._evaluate()
    self.callbacks.dispatch("on_train_end", state)
    return state

  def _train_call(self) -> bool:
    state = self.state
    num_steps = call_length(state.step, state.total_steps, self.steps_per_loop, self.triggers)
    started = self.clock()
    self.in_train_call = True
    output = self.execution.train(num_steps)
    self.in_train_call = False
    state.update(call_seconds=self.clock() - started, call_start_step=state.step, step=output.step,
                 train=dict(output.results), worker_seconds=tuple(output.worker_seconds))
    if not output.finite:
      state.update(step=self.nan_guard.recover(state))
      return False
    self.callbacks.dispatch("after_train_call", state)
    return True

  def _evaluate(self) -> None:
    state = self.state
    state.update(eval=dict(self.execution.evaluate()), eval_step=state.step)
    self.callbacks.dispatch("after_eval", state)


class UserCallbackError(ConfigError):
  """A user's callback raised: the run stops with one line (after saving what it trained, see Loop.on_error)."""


def _where(error, callback):
  """' (in FILE:LINE)': the innermost frame of the error in the callback's own file (else the innermost)."""
  frames = traceback.extract_tb(error.__traceback__)
  source = getattr(inspect.getmodule(type(callback)), "__file__", None)
  own = [frame for frame in frames if source and frame.filename == source] or frames[-1:]
  return f" (in {own[-1].filename}:{own[-1].lineno})" if own else ""


def values(state: State) -> Mapping[str, Any]:
  """The loop values of `state` (for tests and debugging)."""
  return {name: getattr(state, name) for name in State.FIELDS}
