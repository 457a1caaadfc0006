"""Built-in callbacks and user callbacks: one protocol (loops/loop.py HOOKS), one fixed order (`assemble`).

A callback is any object with some of on_train_begin / after_train_call / after_eval / on_call_end /
on_train_end, each taking the loop's State. A `trigger` attribute (a Trigger) makes the loop end a train call
on each of its boundaries. Everything a callback writes goes through state.writer (a no-op off the chief).
"""

import math

import keras

from loops import checkpoints as checkpoints_lib
from loops import plugins
from loops import progress as progress_lib
from loops.errors import ConfigError
from loops.loop import HOOKS
from loops.triggers import Trigger


def assemble(built_in_first, user, built_in_last):
  """The fixed order: observers, then user callbacks, then the saving phase and the run summary."""
  return [*built_in_first, *user, *built_in_last]


def load_user_callbacks(config, objects=()):
  """Instances from config.callbacks ("package.module:factory", factory(config)) followed by `objects`."""
  made = [(name, plugins.load_callable(name, "callbacks", 1)(config)) for name in config.callbacks]
  made += [(type(obj).__name__, obj) for obj in objects]
  for name, callback in made:
    check_callback(name, callback)
  return [callback for _, callback in made]


def check_callback(name, callback):
  hooks = [hook for hook in HOOKS if hasattr(callback, hook)]
  if not hooks:
    raise ConfigError(f"callback '{name}' ({type(callback).__name__}) has none of the methods {', '.join(HOOKS)}")
  for hook in hooks:
    method = getattr(callback, hook)
    if not callable(method) or not plugins.accepts(method, 1):
      raise ConfigError(f"callback '{name}': {hook} must be a method taking one argument (state)")


class Overview:
  """At step 0: the resolved config as text, the HParams tab, grids of the first train and eval inputs."""

  def __init__(self, config, metric_tags, first_batches):
    """first_batches() -> (train batch, eval batch): called only by a writer that writes, at most once."""
    self.config, self.metric_tags, self.first_batches, self._batches = config, metric_tags, first_batches, None

  def on_train_begin(self, state):
    if state.step != 0:
      return
    state.writer.text(0, "config", "```\n" + str(self.config) + "\n```")
    state.writer.hparams(self.config, self.metric_tags)
    state.writer.image_grid(0, "train/input_images", lambda: self._first_batches()[0])
    state.writer.image_grid(0, "eval/input_images", lambda: self._first_batches()[1])

  def _first_batches(self):
    self._batches = self._batches or self.first_batches()
    return self._batches


class TrainLog:
  """After each call: train/... scalars, learning rate, images/s, step and epoch times; a console line."""

  def __init__(self, optimizer, global_batch_size, progress_bar="off"):
    self.optimizer, self.global_batch_size, self.progress_bar_mode = optimizer, global_batch_size, progress_bar
    self.progress = self.bar = None

  def on_train_begin(self, state):
    self.progress = progress_lib.Progress(state.step, state.total_steps, self.global_batch_size,
                                          state.steps_per_epoch)
    self.bar = state.writer.progress_bar(self.progress_bar_mode, state.total_steps, state.step)
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
    state.writer.info("step %d/%d (epoch %.2f): loss %.4f, accuracy %.4f, %.0f images/s, ETA %s%s", state.step,
                      state.total_steps, state.epoch, state.train["train/loss"], state.train["train/accuracy"],
                      self.progress.examples_per_sec(), progress_lib.format_duration(self.progress.eta_seconds()),
                      epoch_time)
    if self.bar:
      self.bar.update(state.step, [(k.split("/")[1], v) for k, v in state.train.items()])

  def on_train_end(self, state):
    trained = state.step != state.start_step
    state.summary.update({"train_seconds": self.progress.train_seconds,
                          "examples_per_sec": self.progress.examples_per_sec() if trained else None,
                          "mean_epoch_seconds_excluding_first": self.progress.mean_epoch_seconds()})


class Histograms:
  """Every summary.histogram_every_steps: weight histograms and gradient norms on a fixed batch (all replicas)."""

  def __init__(self, every_steps, model, execution):
    self.trigger, self.model, self.execution = Trigger(every_steps), model, execution

  def after_train_call(self, state):
    if not self.trigger.due(state.call_start_step, state.step):
      return
    norms = self.execution.gradient_norms()  # on every task: it runs on every replica
    state.writer.histograms(state.step, lambda: {f"weights/{v.path}": v.numpy()
                                                 for v in self.model.trainable_variables})
    if norms is not None:
      state.writer.histograms(state.step, {"gradients/norm_per_variable": norms})
      state.writer.scalars(state.step, {"train/gradient_global_norm": float(math.sqrt((norms ** 2).sum()))})


class ProfileTrace:
  """A profiler trace of summary.profile_steps = (first, last), rounded out to whole train calls."""

  def __init__(self, profile_steps, steps_per_loop):
    self.range, self.steps_per_loop, self.tracing = tuple(profile_steps), steps_per_loop, False

  def on_train_begin(self, state):
    self.on_call_end(state)

  def on_call_end(self, state):  # before the next call
    if self.range and not self.tracing and self.range[0] <= state.step + self.steps_per_loop \
        and state.step < self.range[1]:
      state.writer.start_trace("profile")
      self.tracing = True

  def after_train_call(self, state):
    if self.tracing and state.step >= self.range[1]:
      self.on_train_end(state)
      state.writer.info("profiler trace of steps %d..%d in %s/profile", *self.range, state.workdir)

  def on_train_end(self, state):
    if self.tracing:
      state.writer.stop_trace()
      self.tracing = False


class EvalLog:
  """After each eval: eval/... scalars and a console line."""

  def after_eval(self, state):
    state.writer.scalars(state.step, dict(state.eval))
    state.writer.info("eval at step %d: %s", state.step, format_values(state.eval))


class BestCheckpoint:
  """After each eval: keeps the checkpoint with the best checkpoint.best_metric in workdir/best (saved inside
  `weights_context`: with EMA, the model's weights in it are the averages that were evaluated)."""

  def __init__(self, best, weights_context):
    self.best, self.weights_context = best, weights_context

  def after_eval(self, state):
    record = self.best.update(state.step, state.eval, self.weights_context)
    if record:
      state.writer.write_json(checkpoints_lib.BEST_RECORD, record)

  def on_train_end(self, state):
    state.summary.update(self.best.summary())


class EarlyStopping:
  """Stops the run when `metric` has not improved by more than min_delta for `patience` evals in a row.

  variables: best, best_step, evals_since (checkpointed with the model, so the count survives resume).
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


class Preemption:
  """After each call (after any eval): if the cluster preempted this task, save at this step and exit."""

  def __init__(self, watcher):
    self.watcher = watcher

  def on_call_end(self, state):
    self.watcher.save_and_exit_if_preempted(state.step, before_exit=state.writer.flush)


def format_values(values):
  return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
