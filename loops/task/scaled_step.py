"""A step-level task's train_step as it is traced: the optimizers it is given are watched (a `_Watched` proxy each,
during the trace only), so three mistakes are one error line when the step is first traced, before step 1:

- an optimizer applied inside control flow of the step (tf.cond or `if` on a tensor, a while loop, a nested
  tf.function: the default graph at the apply is not the one the step started in). Its all-reduce (merge_call)
  cannot be compiled there on several replicas (`RuntimeError: 'merge_call' called while defining a new graph`);
  refused on one replica too, so a step that trains on one device does not fail later on several. Task.update_every
  with ctx.updates(name) is the supported way to update a model every k steps (loops/task/update_every.py);
- an optimizer applied in a variant of the step where Task.update_every skips its model (update_every would be
  silently ignored);
- under mixed_precision='float16', an optimizer applied to gradients of a loss it did not scale (its update would be
  divided by the loss scale, ~32768, and training would silently stall).
"""

import keras
import tensorflow as tf

from errors import ConfigError

_APPLY = ("apply_gradients", "apply")
SEE = "see docs/tasks.md, 'The contract': a model updated every k steps"


class _StepWatch:
  """What the traced step did with its optimizers: which scaled a loss, which applied; checks each apply."""

  def __init__(self, task, ctx):
    self.task_name, self.ctx = type(task).__name__, ctx
    self.graph = tf.compat.v1.get_default_graph()  # the graph the step started in
    self.scaled, self.applied = set(), set()

  def before_apply(self, name):
    """Raises ConfigError when optimizer `name` applies inside control flow or where update_every skips it."""
    if tf.compat.v1.get_default_graph() is not self.graph:
      raise ConfigError(f"{self.task_name}.train_step applies optimizer '{name}' inside control flow (tf.cond/if on "
                        f"a tensor/while): on several replicas this cannot compile; declare update_every = "
                        f"{{'{name}': k}} and branch on ctx.updates('{name}') ({SEE})")
    if not self.ctx.updates(name):
      raise ConfigError(f"{self.task_name}.train_step applies optimizer '{name}' on a step where update_every skips "
                        f"it: apply it only under `if ctx.updates('{name}'):` ({SEE})")
    self.applied.add(name)


class _Watched:
  """An optimizer as the traced step sees it: notes scale_loss, checks apply calls, forwards everything else
  (attributes read and set; isinstance sees the optimizer's class)."""

  _OWN = ("_name", "_optimizer", "_watch")

  def __init__(self, name, optimizer, watch):
    for attr, value in zip(self._OWN, (name, optimizer, watch)):
      object.__setattr__(self, attr, value)

  @property
  def __class__(self):
    return type(self._optimizer)

  def scale_loss(self, loss):
    self._watch.scaled.add(self._name)
    return self._optimizer.scale_loss(loss)

  def __getattr__(self, attr):
    value = getattr(self._optimizer, attr)
    if attr not in _APPLY:
      return value

    def checked_apply(*args, **kwargs):
      self._watch.before_apply(self._name)
      return value(*args, **kwargs)

    return checked_apply

  def __setattr__(self, attr, value):
    setattr(self._optimizer, attr, value)


def train_step(task, batch, models, optimizers, ctx):
  """task.train_step(batch, models, optimizers, ctx) with its optimizers watched (checked at trace time)."""
  watch = _StepWatch(task, ctx)
  loss = task.train_step(batch, models, {name: _Watched(name, o, watch) for name, o in optimizers.items()}, ctx)
  scaling = {name for name, o in optimizers.items() if isinstance(o, keras.optimizers.LossScaleOptimizer)}
  unscaled = sorted((watch.applied & scaling) - watch.scaled)
  if unscaled:
    raise ConfigError(f"{watch.task_name}.train_step applies optimizers {unscaled} to gradients of an "
                      f"unscaled loss: under mixed_precision='float16' take gradients of "
                      f"optimizers[name].scale_loss(loss) (apply_gradients unscales them; a no-op in float32)")
  return loss
