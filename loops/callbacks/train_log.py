"""TrainLog: after each call the train/... scalars, learning rate, images/s and step time; a console line."""

import keras

from loops.core import progress as progress_lib
from loops.core.interfaces import Callback


class TrainLog(Callback):
  """Scalars and console lines after each train call; train time and throughput in summary.json.

  Args:
    optimizer: the run's optimizer (its learning rate is the value written).
    global_batch_size: examples per step.
    progress_bar: summary.progress_bar ("auto", "on", "off").
    task_scalars: the task's train scalars shown on the console line ("loss" and Task.train_metrics).
  """

  def __init__(self, optimizer, global_batch_size, progress_bar="off", task_scalars=("loss", "accuracy")):
    self.optimizer, self.global_batch_size, self.progress_bar_mode = optimizer, global_batch_size, progress_bar
    self.task_scalars = tuple(task_scalars)
    self.progress = self.bar = None

  def on_train_begin(self, state):
    self.progress = progress_lib.Progress(state.step, state.total_steps, self.global_batch_size,
                                          state.steps_per_epoch)
    self.bar = state.writer.progress_bar(self.progress_bar_mode, state.total_steps, state.step)
    if self.bar:
      self.bar.stateful_metrics.update(self.task_scalars)  # each value is already the call's mean
    if state.step >= state.total_steps:
      state.writer.info("step %d of %d already done: evaluating only", state.step, state.total_steps)

  def after_train_call(self, state):
    steps = state.step - state.call_start_step
    finished_epochs = self.progress.record(state.step, state.call_seconds)
    lr = float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))
    state.writer.scalars(state.step, {**state.train, "train/learning_rate": lr,
                                      "train/examples_per_sec": self.progress.examples_per_sec(),
                                      "train/step_time_sec": state.call_seconds / steps})
    for epoch, seconds in finished_epochs.items():  # at the step that ended the epoch
      state.writer.scalars(epoch * state.steps_per_epoch, {"train/epoch_time_sec": seconds})
    epoch_time = "".join(f", epoch {e} took {s:.2f} s" for e, s in finished_epochs.items())
    scalars = ", ".join(f"{tag.split('/', 1)[1]} {value:.4f}" for tag, value in state.train.items()
                        if tag.split("/", 1)[1] in self.task_scalars)
    state.writer.info("step %d/%d (epoch %.2f): %s, %.0f images/s, ETA %s%s", state.step, state.total_steps,
                      state.epoch, scalars, self.progress.examples_per_sec(),
                      progress_lib.format_duration(self.progress.eta_seconds()), epoch_time)
    if self.bar:
      self.bar.update(state.step, [(k.split("/")[1], v) for k, v in state.train.items()
                                   if k.split("/")[1] in self.task_scalars])

  def on_train_end(self, state):
    trained = state.step != state.start_step
    state.summary.update({"train_seconds": self.progress.train_seconds,
                          "examples_per_sec": self.progress.examples_per_sec() if trained else None,
                          "mean_epoch_seconds_excluding_first": self.progress.mean_epoch_seconds()})
