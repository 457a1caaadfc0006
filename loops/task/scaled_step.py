"""A step-level task under mixed_precision='float16': every optimizer is a LossScaleOptimizer, and the step takes
gradients of `optimizers[name].scale_loss(loss)` (Keras' own idiom; a no-op for an optimizer that does not scale).
While the step is traced, the optimizers it is given note which of them scaled a loss and which applied gradients:
one that applied without scaling is one error line (its update would be divided by the loss scale, ~32768, and
training would silently stall)."""

import keras

from errors import ConfigError

_APPLY = ("apply_gradients", "apply")


class _Watched:
  """An optimizer as the traced step sees it: notes scale_loss and apply calls, forwards everything."""

  def __init__(self, name, optimizer, seen):
    self._name, self._optimizer, self._seen = name, optimizer, seen

  def scale_loss(self, loss):
    self._seen["scaled"].add(self._name)
    return self._optimizer.scale_loss(loss)

  def __getattr__(self, attr):
    if attr in _APPLY:
      self._seen["applied"].add(self._name)
    return getattr(self._optimizer, attr)


def train_step(task, batch, models, optimizers, ctx):
  """task.train_step(batch, models, optimizers, ctx); when an optimizer scales losses, checked (at trace time)
  to have scaled a loss for every optimizer it applied."""
  if not any(isinstance(o, keras.optimizers.LossScaleOptimizer) for o in optimizers.values()):
    return task.train_step(batch, models, optimizers, ctx)
  seen = {"scaled": set(), "applied": set()}
  loss = task.train_step(batch, models, {name: _Watched(name, o, seen) for name, o in optimizers.items()}, ctx)
  unscaled = sorted(seen["applied"] - seen["scaled"])
  if unscaled:
    raise ConfigError(f"{type(task).__name__}.train_step applies optimizers {unscaled} to gradients of an unscaled "
                      f"loss: under mixed_precision='float16' take gradients of optimizers[name].scale_loss(loss) "
                      f"(apply_gradients unscales them; a no-op in float32)")
  return loss
