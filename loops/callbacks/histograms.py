"""Histograms: every summary.histogram_every_steps, weight histograms and gradient norms on a fixed batch."""

import math

from loops.core.interfaces import Callback
from loops.core.loop import Trigger


class Histograms(Callback):
  """Weight histograms and per-variable gradient norms (computed on every replica, written by the chief).

  Args:
    every_steps: summary.histogram_every_steps (0 = off).
    model: the run's model.
    execution: the run's Execution (its gradient_norms()).
  """

  def __init__(self, every_steps, model, execution):
    self.trigger, self.model, self.execution = Trigger(every_steps), model, execution


  READS = ("summary",)

  @classmethod
  def for_run(cls, run, summary):
    return cls(summary.histogram_every_steps, run.parts.main_model, run.execution)

  def after_train_call(self, state):
    if not self.trigger.due(state.call_start_step, state.step):
      return
    norms = self.execution.gradient_norms()  # on every process: it runs on every replica
    state.writer.histograms(state.step, lambda: {f"weights/{v.path}": v.numpy()
                                                 for v in self.model.trainable_variables})
    if norms is not None:
      state.writer.histograms(state.step, {"gradients/norm_per_variable": norms})
      state.writer.scalars(state.step, {"train/gradient_global_norm": float(math.sqrt((norms ** 2).sum()))})
