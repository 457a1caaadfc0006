"""TrainLog: after each call the train/... scalars, learning rate, images/s (examples/s of other features) and step
time; on a terminal the live bar, elsewhere (a log file, SLURM) one line per call."""

import keras

from loops.core import progress as progress_lib
from loops.core.interfaces import Callback


class TrainLog(Callback):
  """Scalars and the console after each train call; train time and throughput in summary.json.

  Args:
    optimizers: {model name: optimizer}: train/learning_rate is the rate of "model"'s (else the first), and with
      several optimizers each one's as train/learning_rate/<name>: the rate each applies now.
    global_batch_size: examples per step.
    progress_bar: summary.progress_bar ("auto": the bar on a terminal, lines elsewhere; "on"; "off": lines).
    unit: what the throughput counts ("images", or "examples" of other features: progress.throughput_unit).
  """

  def __init__(self, optimizers, global_batch_size, progress_bar="off", unit="images"):
    self.optimizers, self.global_batch_size, self.progress_bar_mode = optimizers, global_batch_size, progress_bar
    self.unit = unit
    self.progress = self.bar = None


  READS = ("summary",)

  @classmethod
  def for_run(cls, run, summary):
    return cls(run.parts.optimizers, run.parts.plan.global_batch_size, summary.progress_bar,
               progress_lib.throughput_unit(run.parts.source))

  def on_train_begin(self, state):
    self.progress = progress_lib.Progress(state.step, state.total_steps, self.global_batch_size,
                                          state.steps_per_epoch)
    if state.step >= state.total_steps:
      state.writer.info("step %d of %d already done: evaluating only", state.step, state.total_steps)
      return
    self.bar = state.writer.progress_bar(self.progress_bar_mode, state.total_steps)
    if self.bar:
      self.bar.update(state.step, details=[_epoch(state)])

  def after_train_call(self, state):
    steps = state.step - state.call_start_step
    finished_epochs = self.progress.record(state.step, state.call_seconds)
    state.writer.scalars(state.step, {**state.train, **self._learning_rates(),
                                      "train/examples_per_sec": self.progress.examples_per_sec(),
                                      "train/step_time_sec": state.call_seconds / steps})
    for epoch, seconds in finished_epochs.items():  # at the step that ended the epoch
      state.writer.scalars(epoch * state.steps_per_epoch, {"train/epoch_time_sec": seconds})
    if self.bar:
      self._draw_bar(state, steps)
    else:
      state.writer.info("%s", self._call_line(state, finished_epochs))

  def _learning_rates(self):
    rates = {name: float(keras.ops.convert_to_numpy(o.learning_rate)) for name, o in self.optimizers.items()}
    if not rates:
      return {}
    tags = {"train/learning_rate": rates.get("model", next(iter(rates.values())))}
    if len(rates) > 1:
      tags.update({f"train/learning_rate/{name}": rate for name, rate in rates.items()})
    return tags

  def _draw_bar(self, state, steps):
    """The bar, ETA and time per step, then every train scalar, the epoch and images/s or examples/s (cut at the
    terminal's width: the train scalars first)."""
    timing = f"ETA {self._eta()} {1000 * state.call_seconds / steps:.0f}ms/step"
    values = [f"{name}: {value:.4g}" for name, value in _train_values(state)]
    self.bar.update(state.step, timing, [*values, _epoch(state), self._rate()])

  def _rate(self):
    return f"{self.progress.examples_per_sec():.0f} {self.unit}/s"

  def _eta(self):
    return progress_lib.format_duration(self.progress.eta_seconds())

  def _call_line(self, state, finished_epochs):
    """'step 50/1100 (epoch 2.27): loss 1.318, accuracy 0.5566, 2926 images/s, ETA 0:23, epoch 2 took 0.07 s'."""
    values = [f"{name} {value:.4g}" for name, value in _train_values(state)]
    parts = [*values, self._rate(), f"ETA {self._eta()}"]
    return f"step {state.step}/{state.total_steps} (epoch {state.epoch:.2f}): {', '.join(parts)}" + epoch_times(
        finished_epochs)

  def on_train_end(self, state):
    if self.bar:
      self.bar.close()
    state.summary.update({"train_seconds": self.progress.train_seconds,
                          "examples_per_sec": self.progress.examples_per_sec() if self.progress.steady() else None,
                          "mean_epoch_seconds_excluding_first": self.progress.mean_epoch_seconds()})


def _epoch(state):
  """'epoch 25.0/50' ('/909.1' for a length in steps that is not whole epochs)."""
  epochs = state.total_steps / state.steps_per_epoch
  return f"epoch {state.epoch:.1f}/{epochs:.0f}" if epochs == int(epochs) else f"epoch {state.epoch:.1f}/{epochs:.1f}"


def _train_values(state):
  """(name, value) of every train scalar of the call ('train/loss' -> 'loss'), as the run reports them."""
  return [(tag.split("/", 1)[-1], float(value)) for tag, value in state.train.items()]


def epoch_times(finished_epochs):
  """', epoch 3 took 0.07 s' for one epoch a call finished, ', epochs 5-7 took 0.07 s each' (their mean) for
  several; '' for none. Each epoch is named once, on the line of the call that finished it."""
  if not finished_epochs:
    return ""
  epochs = sorted(finished_epochs)
  mean = sum(finished_epochs.values()) / len(epochs)
  if len(epochs) == 1:
    return f", epoch {epochs[0]} took {mean:.2f} s"
  return f", epochs {epochs[0]}-{epochs[-1]} took {mean:.2f} s each"
