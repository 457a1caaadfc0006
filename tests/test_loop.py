"""The outer loop's sequencing against a fake execution: no TensorFlow graph, milliseconds per test."""

import contextlib
import json
import math

import pytest

from loops import callbacks as callbacks_lib
from loops import rules
from loops.core import loop as loop_lib
from loops.core.interfaces import HOOKS, Callback, Execution, TrainOutput
from loops.core.loop import Trigger, call_length
from loops.core.nan_guard import NanGuard


class FakeExecution:
  """Counts steps in Python; a call is non-finite when it covers a step in `nan_steps` (each fires `nan_times`)."""

  def __init__(self, step=0, nan_steps=(), nan_times=1, other_workers_stop=None):
    self.step, self.calls, self.evals, self.rewinds, self.starts = step, [], [], [], []
    self.nan_left = {s: nan_times for s in nan_steps}
    self.other_workers_stop = other_workers_stop  # (step, reason): another worker asks to stop at that step

  def start_train(self):
    self.starts.append(self.step)

  def train(self, num_steps):
    assert self.starts, "a train call before start_train"
    start, self.step = self.step, self.step + num_steps
    self.calls.append((start, self.step))
    hit = [s for s, left in self.nan_left.items() if start < s <= self.step and left > 0]
    for s in hit:
      self.nan_left[s] -= 1
    return TrainOutput(self.step, {"train/loss": math.nan if hit else 1.0 / self.step,
                                            "train/accuracy": 0.5}, finite=not hit)

  def evaluate(self):
    self.evals.append(self.step)
    return {"eval/loss": 1.0 / self.step if self.step else 1.0, "eval/accuracy": 0.9}

  def rewind(self, step):
    self.rewinds.append(step)

  def agree_on_stop(self, reason):
    if reason is None and self.other_workers_stop and self.step >= self.other_workers_stop[0]:
      return self.other_workers_stop[1]
    return reason


class FakeCheckpoints:
  def __init__(self, execution, saved=()):
    self.execution, self.saved, self.last_saved_step = execution, list(saved), None

  def latest(self):
    return f"ckpt-{self.saved[-1]}" if self.saved else None

  def save(self, step, wait=False):
    self.saved.append(step)
    self.last_saved_step = step

  def roll_back(self):
    self.execution.step = self.saved[-1]
    return self.latest()


class FakeVariable:
  def __init__(self, value):
    self.value = value

  def numpy(self):
    return self.value

  def assign(self, value):
    self.value = value

  def assign_add(self, value):
    self.value += value


class Recorder:
  """Records (name, hook, step) for every hook into a shared list."""

  def __init__(self, name, log, trigger=None):
    self.name, self.log = name, log
    if trigger:
      self.trigger = trigger
    for hook in HOOKS:
      setattr(self, hook, lambda state, hook=hook: self.log.append((self.name, hook, state.step)))


def make_loop(execution, callbacks=(), total=100, steps_per_loop=50, eval_every=0, nan_mode="stop", retries=0,
              checkpoints=None, workdir="/nonexistent", writer=None):
  state = loop_lib.State(step=execution.step, total_steps=total, steps_per_epoch=20, is_chief=True,
                         workdir=workdir, writer=writer)
  checkpoints = checkpoints or FakeCheckpoints(execution)
  guard = NanGuard(nan_mode, retries, checkpoints, execution)
  return loop_lib.Loop(execution, [guard, *callbacks], state, steps_per_loop=steps_per_loop,
                       eval_every_steps=eval_every, nan_guard=guard), state


def test_a_trigger_fires_once_per_boundary_crossed_whatever_the_call_lengths():
  t = Trigger(30)
  assert [t.due(a, b) for a, b in [(0, 29), (29, 30), (30, 59), (50, 100), (0, 0)]] == [False, True, False, True, False]
  assert t.next_boundary(30) == 60 and Trigger(0).next_boundary(5) is None and not Trigger(0).due(0, 10)


@pytest.mark.parametrize("step, total, loop, everies, expected", [
    (0, 100, 50, [], 50), (40, 100, 50, [], 10), (90, 95, 50, [], 5), (0, 100, 50, [30], 30),
    (30, 100, 50, [30, 40], 10), (40, 100, 50, [30, 40], 10), (50, 100, 50, [30, 7], 6)])
def test_a_call_is_shortened_to_the_next_due_boundary(step, total, loop, everies, expected):
  assert call_length(step, total, loop, [Trigger(n) for n in everies]) == expected


def test_calls_end_on_every_eval_and_callback_boundary_that_is_not_a_multiple_of_steps_per_loop():
  execution = FakeExecution()
  log = []
  loop, state = make_loop(execution, [Recorder("ckpt", log, Trigger(40))], eval_every=30)
  loop.run()
  assert execution.calls == [(0, 30), (30, 40), (40, 50), (50, 60), (60, 80), (80, 90), (90, 100)]
  assert execution.starts == [0]  # the input started once, before the first call
  assert execution.evals == [30, 60, 90, 100]  # periodic, then the final eval
  assert state.step == 100 and state.stop_reason is None


def test_hooks_run_in_a_fixed_order_each_call():
  execution = FakeExecution()
  log = []
  loop, _ = make_loop(execution, [Recorder("builtin", log), Recorder("user", log)], total=60, steps_per_loop=30,
                      eval_every=30)
  loop.run()
  assert log[:2] == [("builtin", "on_train_begin", 0), ("user", "on_train_begin", 0)]
  assert log[2:8] == [(name, hook, 30) for hook in ("after_train_call", "after_eval", "on_call_end")
                      for name in ("builtin", "user")]
  assert log[-2:] == [("builtin", "on_train_end", 60), ("user", "on_train_end", 60)]
  assert [entry for entry in log if entry[1] == "after_eval"] == [("builtin", "after_eval", 30),
                                                                  ("user", "after_eval", 30),
                                                                  ("builtin", "after_eval", 60),
                                                                  ("user", "after_eval", 60)]
  assert execution.evals == [30, 60]  # the eval at the last step is not repeated


def test_a_stop_request_ends_the_run_after_the_current_call_with_a_final_eval():
  execution = FakeExecution()
  log = []

  class StopAt20:
    def after_train_call(self, state):
      if state.step >= 20:
        state.request_stop("enough")
        state.request_stop("a second reason is ignored")

  loop, state = make_loop(execution, [StopAt20(), Recorder("r", log)], steps_per_loop=10)
  loop.run()
  assert execution.calls == [(0, 10), (10, 20)]
  assert execution.evals == [20] and state.stop_reason == "enough"
  assert log[-1] == ("r", "on_train_end", 20)
  assert ("r", "on_call_end", 20) in log  # the call that asked to stop still ends normally (saving phase)


def test_a_stop_asked_on_another_worker_stops_this_one_at_the_same_step():
  execution = FakeExecution(other_workers_stop=(30, "asked on worker 1"))
  loop, state = make_loop(execution, steps_per_loop=10)
  loop.run()
  assert execution.calls[-1] == (20, 30) and state.stop_reason == "asked on worker 1"


def test_nan_stop_names_the_steps_of_the_call():
  loop, _ = make_loop(FakeExecution(nan_steps=[17]), steps_per_loop=5)
  with pytest.raises(FloatingPointError, match=r"non-finite loss in steps 16\.\.20 \(nan_policy.mode=stop\)"):
    loop.run()


def test_nan_rollback_restores_rewinds_discards_the_call_and_retries():
  execution = FakeExecution(nan_steps=[17])
  log = []
  checkpoints = FakeCheckpoints(execution)
  periodic = callbacks_lib.Checkpointing(checkpoints, 10, FakeVariable(0))
  loop, state = make_loop(execution, [Recorder("r", log), periodic], total=30, steps_per_loop=5,
                          nan_mode="rollback", retries=1, checkpoints=checkpoints)
  loop.run()
  assert checkpoints.saved == [0, 10, 20, 30]  # rollback mode first makes sure there is something to roll back to
  assert execution.calls == [(0, 5), (5, 10), (10, 15), (15, 20), (10, 15), (15, 20), (20, 25), (25, 30)]
  assert execution.rewinds == [10]
  assert ("r", "after_train_call", 20) in log and log.count(("r", "after_train_call", 20)) == 1  # discarded once
  assert state.summary["nan_rollbacks"] == 1


def test_a_persistent_nan_exhausts_the_retries():
  loop, _ = make_loop(FakeExecution(nan_steps=[12], nan_times=5), steps_per_loop=5, nan_mode="rollback", retries=2)
  with pytest.raises(FloatingPointError, match=r"steps 11\.\.15 after 2 rollback\(s\)"):
    loop.run()


def test_state_is_read_only_for_the_loops_values():
  _, state = make_loop(FakeExecution())
  with pytest.raises(AttributeError):
    state.step = 5
  with pytest.raises(TypeError):
    state.train["train/loss"] = 0.0


def test_checkpoints_are_periodic_and_the_last_one_comes_after_the_final_eval():
  execution = FakeExecution()
  checkpoints = FakeCheckpoints(execution)
  order = []
  checkpoints.save = lambda step, wait=False: (order.append(("save", step)), setattr(checkpoints, "last_saved_step", step))
  execution.evaluate = lambda: (order.append(("eval", execution.step)), {"eval/loss": 1.0})[1]
  loop, _ = make_loop(execution, [callbacks_lib.Checkpointing(checkpoints, 40, FakeVariable(0))], total=100,
                      steps_per_loop=50, checkpoints=checkpoints)
  loop.run()
  assert order == [("save", 40), ("save", 80), ("eval", 100), ("save", 100)]


def test_a_stopped_run_remembers_it_and_a_rerun_trains_only_when_the_length_was_raised(tmp_path):
  (tmp_path / "summary.json").write_text(json.dumps({"stopped_early": "early stopping: eval/loss ..."}))
  stopped = FakeVariable(0)
  execution = FakeExecution()

  class StopAt20:
    def after_train_call(self, state):
      if state.step == 20:
        state.request_stop("enough")

  checkpoints = FakeCheckpoints(execution)
  loop, _ = make_loop(execution, [StopAt20(), callbacks_lib.Checkpointing(checkpoints, 0, stopped)], steps_per_loop=10,
                      checkpoints=checkpoints)
  loop.run()
  assert stopped.value == 100 and checkpoints.saved == [20]  # the stop is in the final checkpoint

  class Writer:
    def info(self, message, *args):
      self.said = message % args

  for total, trains in ((100, False), (150, True)):
    rerun = FakeExecution(step=20)
    loop, state = make_loop(rerun, [callbacks_lib.Checkpointing(FakeCheckpoints(rerun, [20]), 0, stopped)],
                            total=total, steps_per_loop=10, workdir=str(tmp_path), writer=Writer())
    loop.run()
    assert bool(rerun.calls) == trains
    assert rerun.starts == ([20] if trains else [])  # a finished run never starts its train input
    if not trains:
      assert state.stop_reason == "early stopping: eval/loss ..." and "not training further" in state.writer.said
      assert stopped.value == 100
  assert stopped.value == 0 and rerun.step == 150


@pytest.mark.parametrize("mode, values, patience, min_delta, stops_after", [
    ("min", [1.0, 0.9, 0.95, 0.91, 0.92], 2, 0.0, 4),  # best 0.9 at eval 2, then two evals without improvement
    ("min", [1.0, 0.99, 0.989, 0.97], 2, 0.015, 3),  # improvements smaller than min_delta do not count
    ("max", [0.5, 0.6, 0.7, 0.8], 1, 0.0, None),
    ("max", [0.5, 0.6, 0.6, 0.59], 1, 0.0, 3),
])
def test_early_stopping_counts_evals_without_improvement(mode, values, patience, min_delta, stops_after):
  stopping = callbacks_lib.EarlyStopping("eval/loss", mode, patience, min_delta, lambda value, dtype: FakeVariable(value))
  state = loop_lib.State(step=0, total_steps=100, steps_per_epoch=10, is_chief=True, workdir="", writer=None)
  for i, value in enumerate(values, start=1):
    state.update(step=i * 10, eval={"eval/loss": value})
    stopping.after_eval(state)
    if state.stop_reason:
      break
  assert (i if state.stop_reason else None) == stops_after
  if stops_after:
    assert state.stop_reason.startswith(f"early stopping: eval/loss did not improve by more than {min_delta} in "
                                        f"{patience} evals (best ")


def test_a_run_early_stopping_stopped_continues_with_its_patience_anew_and_its_best_kept():
  """Continued to a greater length, it trained one eval only (the restored count was already at patience)."""
  stopping = callbacks_lib.EarlyStopping("eval/loss", "min", 2, 0.0, lambda value, dtype: FakeVariable(value))
  state = loop_lib.State(step=0, total_steps=100, steps_per_epoch=10, is_chief=True, workdir="", writer=None)
  for step, value in ((10, 0.5), (20, 0.6), (30, 0.7)):
    state.update(step=step, eval={"eval/loss": value})
    stopping.after_eval(state)
  assert state.stop_reason.startswith("early stopping: eval/loss did not improve by more than 0.0 in 2 evals (best "
                                      "0.5 at step 10)")
  continued = loop_lib.State(step=30, total_steps=200, steps_per_epoch=10, is_chief=True, workdir="", writer=None)
  stopping.on_train_begin(continued)
  continued.update(step=40, eval={"eval/loss": 0.6})
  stopping.after_eval(continued)
  assert not continued.stop_reason
  continued.update(step=50, eval={"eval/loss": 0.55})
  stopping.after_eval(continued)
  assert continued.stop_reason.startswith("early stopping: eval/loss did not improve by more than 0.0 in 2 evals ("
                                          "best 0.5 at step 10)")


def test_user_callbacks_are_checked_for_their_hooks():
  with pytest.raises(ValueError, match=r"callback 'Nothing' \(Nothing\) has none of the methods on_train_begin"):
    rules.check_callbacks([("Nothing", type("Nothing", (), {})())])

  class Bad:
    def after_eval(self):
      pass

  with pytest.raises(ValueError, match=r"callback 'x:y': after_eval must be a method taking one argument \(state\)"):
    rules.check_callbacks([("x:y", Bad())])


def test_state_changes_only_through_its_update_method_and_names_what_it_does_not_hold():
  state = loop_lib.State(step=5, total_steps=10, steps_per_epoch=5, is_chief=True, workdir="", writer=None)
  with pytest.raises(AttributeError):
    state.step = 6  # a read-only property
  state.update(step=6, eval={"eval/loss": 1.0})
  assert (state.step, dict(state.eval), state.start_step, state.epoch) == (6, {"eval/loss": 1.0}, 5, 1.2)
  with pytest.raises(AttributeError, match=r"State has no loop value\(s\) \['stpe'\]; valid: step, "):
    state.update(stpe=7)
  state.request_stop("first")
  state.request_stop("second")
  assert state.stop_reason == "first"


def test_the_callback_base_class_declares_every_hook_as_a_no_op_and_a_subclass_runs_in_the_loop():
  assert HOOKS == ("on_train_begin", "after_train_call", "after_eval", "on_call_end", "on_train_end")
  state = loop_lib.State(step=0, total_steps=1, steps_per_epoch=1, is_chief=True, workdir="", writer=None)
  assert all(getattr(Callback(), hook)(state) is None for hook in HOOKS)
  rules.check_callbacks([("base", Callback())])

  class Evals(Callback):
    seen = []

    def after_eval(self, state):
      self.seen.append(state.step)

  loop, _ = make_loop(FakeExecution(), [Evals()], total=40, steps_per_loop=10, eval_every=20)
  loop.run()
  assert Evals.seen == [20, 40]


def test_the_fake_execution_satisfies_the_execution_protocol_and_an_object_without_train_does_not():
  class Complete(FakeExecution):
    def averaged_weights(self):
      return contextlib.nullcontext()

    def gradient_norms(self):
      return None

  assert isinstance(Complete(), Execution)
  assert not isinstance(object(), Execution)
