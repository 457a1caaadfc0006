"""The built-in task (task.name="classification"): images -> logits, model.name / loss.name / eval.metrics.

What ran before tasks existed, unchanged: the per-example loss from loss.name (with its images/outputs/step
keywords), train/accuracy, eval/loss plus the eval.metrics Keras metrics updated on (labels, logits).
"""

import tensorflow as tf

from errors import ConfigError
from loops.modeling import losses
from loops.task import interface, user_call

_plain = tf.autograph.experimental.do_not_convert  # branches on Python values only; the loss is the user's (user_call)


@_plain
def forward(model, images, training):
  """(logits in float32 or wider, outputs): `outputs` is the model's dict, or {"logits": output} for a plain output.
  A float64 model (the check's floor) keeps float64 logits: its loss has no float32 rounding."""
  outputs = model(images, training=training)
  if isinstance(outputs, dict):
    if "logits" not in outputs:
      raise ConfigError(f"model '{model.name}' returned a dict without 'logits' (keys: {sorted(outputs)}); "
                        f"name the class scores 'logits'")
    logits = outputs["logits"]
  else:
    logits, outputs = outputs, {"logits": outputs}
  return losses.at_least_float32(logits), outputs


@_plain
def correct(labels, logits):
  """1.0 where the largest logit is the (hard) label, per example."""
  hard = tf.cast(losses.hard_labels(labels), tf.int64)
  return tf.cast(tf.equal(tf.argmax(logits, axis=-1), hard), tf.float32)


@_plain
def _user_loss(loss_fn, labels, logits, images, outputs, step):
  """loss_fn's per-example losses, converted by AutoGraph as the user's code (a built-in loss is not)."""
  return user_call(loss_fn, labels, logits, images=images, outputs=outputs, step=step)


class ImageClassification(interface.Task):
  """Loss level: loss.name on the model's logits; train/accuracy; eval.metrics see (labels, logits)."""

  train_metrics = ("accuracy",)

  def __init__(self, loss_fn, metrics=None):
    self.loss_fn = loss_fn
    self._metrics = metrics or {}

  @_plain
  def per_example_loss(self, batch, models, ctx):
    images, labels = batch
    logits, outputs = forward(models["model"], images, training=ctx.training)
    ctx.log("accuracy", correct(labels, logits))
    return _user_loss(self.loss_fn, labels, logits, images, outputs, self._step(ctx))

  @_plain
  def eval_step(self, batch, models, ctx):
    images, labels = batch
    logits, outputs = forward(models["model"], images, training=False)
    for metric in ctx.metrics.values():
      metric.update_state(labels, logits, sample_weight=ctx.weights)
    return {"loss": _user_loss(self.loss_fn, labels, logits, images, outputs, self._step(ctx))}

  @_plain
  def predict_step(self, batch, models, ctx):
    """Each example's class probabilities (softmax of the logits) and its class (the largest)."""
    logits, _ = forward(models["model"], batch[0], training=False)
    return {"probabilities": tf.nn.softmax(logits), "class": tf.argmax(logits, axis=-1)}

  @_plain
  def _step(self, ctx):
    """The step only for a loss that reads it: reading the counter each step orders the step after its update
    (measured on digits: the built-in step 1.04x faster without the read)."""
    return ctx.step if "step" in getattr(self.loss_fn, "declared", ("step",)) else None

  def add_metrics(self, metrics):
    """More eval metrics updated on (labels, logits), e.g. a compile()d model's (loops/modeling/keras_fit.py)."""
    self._metrics = {**self._metrics, **metrics}

  def build_metrics(self):
    return dict(self._metrics)
