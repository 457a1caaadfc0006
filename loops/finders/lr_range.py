"""The learning-rate range test (Smith 2017, "Cyclical learning rates", section 3.3): a fresh model trained one
step per call while the learning rate rises exponentially from find.lr_min to find.lr_max; stops once the loss
diverges; writes the loss-vs-lr curve (PNG, TensorBoard, JSON) and suggests a learning rate.

The ramp is a Keras LearningRateSchedule of the optimizer's update count, so it is evaluated inside the
compiled step on every synchronous strategy, exactly as a training schedule would be.
"""

import dataclasses
import io
import math
import posixpath

import keras
import numpy as np
import tensorflow as tf

from loops.finders import trial
from loops.modeling import optimizers
from loops.persist import writers

OUT = "lr_find"
RULE = ("the learning rate at the steepest descent of the smoothed loss (most negative slope per decade of "
        "learning rate, before the smoothed loss's minimum)")


class ExponentialRamp(keras.optimizers.schedules.LearningRateSchedule):
  """lr(step) = lr_min x (lr_max / lr_min) ** (step / (steps - 1)), held at lr_max after the last step."""

  def __init__(self, lr_min, lr_max, steps):
    self.lr_min, self.lr_max, self.steps = float(lr_min), float(lr_max), int(steps)

  def __call__(self, step):
    fraction = keras.ops.minimum(keras.ops.cast(step, "float32") / (self.steps - 1), 1.0)
    return self.lr_min * keras.ops.power(self.lr_max / self.lr_min, fraction)

  def at(self, step):
    """The same value on the host, in float64."""
    return self.lr_min * (self.lr_max / self.lr_min) ** (min(step, self.steps - 1) / (self.steps - 1))

  def get_config(self):
    return {"lr_min": self.lr_min, "lr_max": self.lr_max, "steps": self.steps}


@dataclasses.dataclass
class Curve:
  """The range test's record: one entry per step taken."""
  learning_rates: list = dataclasses.field(default_factory=list)
  losses: list = dataclasses.field(default_factory=list)
  smoothed: list = dataclasses.field(default_factory=list)
  stop_reason: str = ""  # "" when the ramp ran to lr_max

  def add(self, learning_rate, loss, beta, diverge_factor):
    """Records one step; returns False (and sets stop_reason) once the loss diverged."""
    self.learning_rates.append(learning_rate)
    self.losses.append(loss)
    if not math.isfinite(loss):
      self.smoothed.append(float("nan"))
      self.stop_reason = f"the loss was not finite ({loss}) at lr {learning_rate:.3g}"
      return False
    n = len(self.losses)
    average = (self.smoothed[-1] * (1 - beta ** (n - 1)) if n > 1 else 0.0) * beta + (1 - beta) * loss
    self.smoothed.append(average / (1 - beta ** n))  # bias-corrected exponential moving average
    best = min(self.smoothed)
    if self.smoothed[-1] > diverge_factor * best:
      self.stop_reason = (f"the smoothed loss {self.smoothed[-1]:.4g} exceeded {diverge_factor:g} x its lowest "
                          f"{best:.4g} at lr {learning_rate:.3g}")
      return False
    return True


def suggest(learning_rates, smoothed):
  """(suggested lr by RULE, lr of the lowest smoothed loss), or (None, ...) when the curve is too short."""
  values = np.asarray([s for s in smoothed if math.isfinite(s)], np.float64)
  lowest = int(np.argmin(values)) if len(values) else 0
  lowest_lr = learning_rates[lowest] if len(values) else None
  if lowest < 2:
    return None, lowest_lr
  log_lr = np.log10(np.asarray(learning_rates[:len(values)], np.float64))
  slope = np.gradient(values, log_lr)  # central differences: ~0 at the minimum itself
  return float(learning_rates[int(np.argmin(slope[:lowest]))]), lowest_lr


def run_ramp(execution, optimizer, ramp, find_config):
  """Trains one step per call up the ramp; returns the Curve (every process sees the same all-reduced loss, so every
  worker stops at the same step)."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer (float16)
  curve = Curve()
  for _ in range(ramp.steps):
    learning_rate = ramp.at(int(inner.iterations.numpy()))
    loss = execution.train(1).results["train/loss"]
    if not curve.add(learning_rate, loss, find_config.smoothing, find_config.diverge_factor):
      break
  return curve


def _ramp_every_optimizer(parts, f):
  """Each trained model's optimizer ramps at its base rate's ratio to the main one's (a task's several
  optimizers keep their proportions; the suggestion is the main optimizer's rate)."""
  main = parts.learning_rates[next(name for name, o in parts.optimizers.items() if o is parts.main_optimizer)]
  for name, optimizer in parts.optimizers.items():
    ratio = parts.learning_rates[name] / main
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer (float16)
    inner.learning_rate = ExponentialRamp(f.lr_min * ratio, f.lr_max * ratio, f.lr_steps)


def find_lr(config, f, optimizer_settings, workdir):
  """The range test for config's run (checked by loops/finders/rules.py); writes workdir/lr_find; returns a dict.
  f, optimizer_settings: the find and optimizer settings; config: the bag its throw-away run copies."""
  run_config = trial.throwaway_config(config, f.lr_steps)
  role = trial.role_of(run_config, workdir)
  out = trial.output_dir(workdir, OUT)
  parts, execution = trial.start(run_config, role)
  ramp = ExponentialRamp(f.lr_min, f.lr_max, f.lr_steps)
  _ramp_every_optimizer(parts, f)  # before the first trace
  curve = run_ramp(execution, parts.main_optimizer, ramp, f)
  suggestion, lowest_lr = suggest(curve.learning_rates, curve.smoothed)
  # The flag is the configured rate: the run scales it by optimizer.lr_scaling for its batch and replicas.
  scale = optimizers.scaled_learning_rate(_unit_lr(optimizer_settings), parts.plan.global_batch_size,
                                          parts.plan.replicas)
  result = {"rule": RULE, "suggested_lr": suggestion, "lowest_loss_lr": lowest_lr, "lr_scaling": scale,
            "flag_value": None if suggestion is None else suggestion / scale, "steps": len(curve.losses),
            "stop_reason": curve.stop_reason, "learning_rates": curve.learning_rates, "losses": _finite(curve.losses),
            "smoothed_losses": _finite(curve.smoothed), "lr_min": f.lr_min, "lr_max": f.lr_max, "output": out}
  writer = writers.for_role(out, role.is_chief)
  if role.is_chief:
    _write(writer, out, curve, result)
    _print(result, optimizer_settings.lr_scaling)
  return result


def _finite(values):
  return [value if math.isfinite(value) else None for value in values]  # strict JSON has no NaN


def _unit_lr(optimizer_settings):
  return dataclasses.replace(optimizer_settings, learning_rate=1.0)


def _write(writer, out, curve, result):
  tf.io.gfile.makedirs(out)
  trial.clear_events(out)
  for step, (lr, loss, smooth) in enumerate(zip(curve.learning_rates, curve.losses, curve.smoothed)):
    values = {"lr_find/learning_rate": lr, "lr_find/loss": loss}
    if math.isfinite(smooth):
      values["lr_find/smoothed_loss"] = smooth
    writer.scalars(step, values)
  writer.close()
  writer.write_json("lr_find.json", result)
  with tf.io.gfile.GFile(posixpath.join(out, "lr_find.png"), "wb") as f:
    f.write(plot_png(curve, result["suggested_lr"]))


def plot_png(curve, suggestion):
  """The loss and smoothed loss against the learning rate on a log axis, the suggestion marked; PNG bytes."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot
  figure, axes = pyplot.subplots(figsize=(7, 4.5), dpi=100)
  axes.plot(curve.learning_rates, curve.losses, color="0.75", linewidth=1, label="loss")
  axes.plot(curve.learning_rates, curve.smoothed, color="C0", linewidth=2, label="smoothed loss")
  if suggestion is not None:
    axes.axvline(suggestion, color="C3", linestyle="--", label=f"suggested {suggestion:.3g}")
  axes.set_xscale("log")
  axes.set_xlabel("learning rate (log scale)")
  axes.set_ylabel("train loss")
  finite = [s for s in curve.smoothed if math.isfinite(s)]
  if finite:
    axes.set_ylim(min(finite) * 0.9, max(curve.smoothed[0], min(finite)) * 1.5 + 1e-9)
  axes.legend()
  axes.set_title("learning-rate range test")
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", bbox_inches="tight")
  pyplot.close(figure)
  return buffer.getvalue()


def _print(result, lr_scaling):
  print(f"lr range test: {result['steps']} steps from {result['lr_min']:g} to {result['lr_max']:g}"
        + (f"; stopped: {result['stop_reason']}" if result["stop_reason"] else " (did not diverge)"))
  print(f"curve: {posixpath.join(result['output'], 'lr_find.png')} (TensorBoard: --logdir {result['output']})")
  if result["suggested_lr"] is None:
    print("no suggestion: the smoothed loss did not fall before its minimum; widen find.lr_min..find.lr_max or "
          "raise find.lr_steps")
    return
  print(f"suggested learning rate {result['suggested_lr']:.3g}: {RULE}; the lowest smoothed loss was at "
        f"{result['lowest_loss_lr']:.3g} (a tenth of it, {result['lowest_loss_lr'] / 10:.3g}, is the other rule "
        f"of thumb)")
  note = "" if result["lr_scaling"] == 1 else (f" (optimizer.lr_scaling={lr_scaling} multiplies it by "
                                                f"{result['lr_scaling']:g} for this batch and replica count)")
  print(f"  --config.optimizer.learning_rate={result['flag_value']:.3g}{note}")
