"""The contracts between the loop and what it drives, in code. Pure Python: no TensorFlow.

- `Execution`: what the loop asks of a strategy family (loops/distribute/execution.py implements it twice).
- `Callback`: the hooks the loop calls, as documented no-ops; subclass it, or give any object some of the hooks.
- `LossFunction`, `ModelFunction`, `MetricFactory`, `CallbackFactory`: what a user's `package.module:name`
  string must name (config keys `loss.name`, `model.name`, `eval.metrics`, `callbacks`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ContextManager, Mapping, Optional, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True)
class TrainOutput:
  """What one train call returns.

  Attributes:
    step: the global step the call reached.
    results: its `train/...` scalars (means over the call's steps, over every replica and worker).
    finite: whether its loss was finite.
    worker_seconds: each worker's busy seconds in the call, in task order (multi-worker training; else empty).
  """
  step: int
  results: Mapping[str, float]
  finite: bool
  worker_seconds: tuple = ()


@runtime_checkable
class Execution(Protocol):
  """How a run trains and evaluates under one strategy family; the loop knows nothing else about distribution."""

  @property
  def step(self) -> int:
    """The global step (the framework's own counter, restored with the checkpoint)."""

  def start_train(self) -> None:
    """Starts the train input at the current step and prepares the train call (once, before the first call)."""

  def train(self, num_steps: int) -> TrainOutput:
    """Runs `num_steps` steps in one compiled call."""

  def evaluate(self) -> Mapping[str, float]:
    """One pass over the eval set: {"eval/<metric>": value} over every replica and worker."""

  def rewind(self, step: int) -> None:
    """Restarts the train input at `step` (after a NaN rollback restored an earlier checkpoint)."""

  def agree_on_stop(self, reason: Optional[str]) -> Optional[str]:
    """Every process learns whether any process asked to stop: the first reason, or None."""

  def averaged_weights(self) -> ContextManager[None]:
    """Context in which the model holds its weights' moving averages (optimizer.ema_decay), else as they are."""

  def gradient_norms(self) -> Optional[Sequence[float]]:
    """Per-variable gradient norms on a fixed batch, or None where the strategy family cannot compute them."""


class Callback:
  """The loop's hooks, each called with the loop's `State` (loops/core/loop.py), in this order per train call:

    on_train_begin     once, before the first call (also when a finished run only evaluates)
    after_train_call   after each call whose loss was finite; `state.train` holds its scalars
    after_eval         after each eval; `state.eval` holds its results
    on_call_end        after the call and any eval: the saving phase (checkpoints, preemption)
    on_train_end       once, after the final eval

  Subclass it and override what you need, or pass any object with some of these methods. A `trigger` attribute
  (a `Trigger`) makes every train call end on its boundaries. A `checkpointed` attribute (a tf.Module, or a dict
  of tf.Variables, made in __init__) is saved in every checkpoint of the run and restored on resume, so a counter or
  a best value survives preemption like the model does. Every process runs every callback: keep side effects that
  must happen once behind `state.is_chief`, or write through `state.writer` (a no-op off the chief).
  """

  trigger = None
  checkpointed = None

  def on_train_begin(self, state) -> None:
    """Before the first train call of this process (state.step is where it starts or resumes)."""

  def after_train_call(self, state) -> None:
    """After a train call whose loss was finite (state.call_start_step .. state.step)."""

  def after_eval(self, state) -> None:
    """After an eval at state.eval_step (state.eval: {"eval/<metric>": value})."""

  def on_call_end(self, state) -> None:
    """After the call and its eval, if any: where saving happens."""

  def on_train_end(self, state) -> None:
    """After the final eval; add summary.json fields through state.summary."""


HOOKS = tuple(name for name in vars(Callback) if name.startswith(("on_", "after_")))  # in the order they run


class LossFunction(Protocol):
  """`loss.name="package.module:function"`: ONE LOSS PER EXAMPLE of this replica's batch.

  Args:
    labels: class ids [batch] (int64), or soft labels [batch, classes] when mixup/cutmix mix examples.
    logits: the model's class scores [batch, classes] (float32).
    **kwargs: `loss.kwargs`, and whichever of `images` (the replica's preprocessed batch), `outputs` (the model's
      output dict) and `step` (int64 global step before this update) the function declares.

  Returns:
    A float tensor of shape [batch]: never reduced (the framework averages over the GLOBAL batch).
  """

  def __call__(self, labels: Any, logits: Any, **kwargs: Any) -> Any:
    ...


class ModelFunction(Protocol):
  """`model.name="package.module:function"`, called inside the strategy's scope and the precision policy.

  Args:
    input_shape: (height, width, channels) after preprocessing.
    num_classes: the dataset's number of classes.
    **kwargs: `model.kwargs`.

  Returns:
    A keras.Model whose output is the logits, or a dict with "logits" and any other named outputs.
  """

  def __call__(self, input_shape: tuple, num_classes: int, **kwargs: Any) -> Any:
    ...


class MetricFactory(Protocol):
  """An `eval.metrics` entry "package.module:factory": returns a new keras.metrics.Metric that is updated as
  `update_state(labels, logits, sample_weight=weights)` (labels: class ids; weight 0 marks eval padding) and
  reports as `eval/<metric.name>`."""

  def __call__(self) -> Any:
    ...


CallbackFactory = Callable[[Any], Any]
"""A `callbacks` entry "package.module:factory": `factory(config)` returns a Callback (or any object with hooks)."""
