"""Losses by name or import path, and the per-example contract.

Contract: a loss is `fn(labels, logits, **kwargs) -> per-example losses of shape [batch]` (this replica's
batch). The framework averages over the GLOBAL batch with tf.nn.compute_average_loss; a function that
reduces by itself would silently divide the gradient by the number of replicas, so it is rejected.
Labels are class ids [batch], or soft labels [batch, classes] when data.mixup_alpha/cutmix_alpha mix examples.
A loss may also declare any of the keyword parameters in EXTRA: `images` (this replica's preprocessed batch),
`outputs` (the model's output dict, "logits" included) and `step` (the global step before this update, int64);
it gets exactly the ones it declares.
loss.name="" (the default) is the model's compile()d loss when it has one (loops/modeling/keras_fit.py), else
DEFAULT.
"""

import functools

import keras
import tensorflow as tf

from errors import ConfigError
from loops.core import plugins


EXTRA = ("images", "outputs", "step")
DEFAULT = "sparse_categorical_crossentropy"  # what loss.name="" trains for a model compiled without a loss


@tf.autograph.experimental.do_not_convert
def at_least_float32(x):
  """x in float32, or as it is when float64 (the replica check's float64 floor must not round in float32)."""
  return x if x.dtype == tf.float64 else tf.cast(x, tf.float32)


@tf.autograph.experimental.do_not_convert
def is_soft(labels):
  return labels.shape.rank == 2


@tf.autograph.experimental.do_not_convert
def hard_labels(labels):
  """Class ids: the labels themselves, or the largest share of soft labels."""
  return tf.argmax(labels, axis=-1) if is_soft(labels) else labels


@tf.autograph.experimental.do_not_convert
def as_distribution(labels, logits):
  """Soft labels as they are; class ids one-hot."""
  if is_soft(labels):
    return tf.cast(labels, logits.dtype)
  return tf.one_hot(tf.cast(labels, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)


@tf.autograph.experimental.do_not_convert
def sparse_categorical_crossentropy(labels, logits, label_smoothing=0.0):
  """Cross-entropy against class ids, or against one-hot/soft labels [batch, classes]."""
  if label_smoothing or is_soft(labels):
    return keras.losses.categorical_crossentropy(
        as_distribution(labels, logits), logits, from_logits=True, label_smoothing=label_smoothing)
  return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


@tf.autograph.experimental.do_not_convert
def multiclass_hinge(labels, logits):
  return keras.losses.categorical_hinge(as_distribution(labels, logits), logits)


@tf.autograph.experimental.do_not_convert
def focal(labels, logits, gamma=2.0, alpha=0.25):
  """Focal loss (Lin et al. 2017) on one-hot (or soft) targets, one value per example."""
  return keras.losses.categorical_focal_crossentropy(as_distribution(labels, logits), logits, alpha=alpha,
                                                     gamma=gamma, from_logits=True)


LOSSES = {
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy,
    "focal": focal,
    "multiclass_hinge": multiclass_hinge,
}


def build(loss_config):
  """Returns fn(labels, logits, *, images, outputs, step) -> per-example losses, checked against the contract when
  traced; the wrapped function gets only the keywords of EXTRA it declares."""
  name = loss_config.name or DEFAULT
  kwargs = dict(loss_config.kwargs)
  users = plugins.is_import_path(name)
  if users:
    fn = plugins.load_callable(name, "loss.name", 2, EXTRA)
  else:
    fn = LOSSES[name]  # loops/rules.py checked the name
    if name == "sparse_categorical_crossentropy":
      kwargs.setdefault("label_smoothing", loss_config.label_smoothing)
  bound = functools.partial(fn, **kwargs)
  declared = plugins.declared_keywords(fn, [k for k in EXTRA if k not in kwargs])

  def per_example_loss(labels, logits, *, images=None, outputs=None, step=None):
    given = {"images": images, "outputs": outputs, "step": step}
    if "step" in declared:  # the step counter variable, read only when the loss asks for it
      given["step"] = tf.convert_to_tensor(step)
    losses = bound(labels, logits, **{k: given[k] for k in declared})
    check_per_example(name, losses, logits)
    return at_least_float32(losses)

  if not users:  # a built-in loss: nothing for AutoGraph to convert (loops/task's user_call converts a user's)
    per_example_loss = tf.autograph.experimental.do_not_convert(per_example_loss)
  per_example_loss.declared = frozenset(declared)  # the keywords it reads (callers skip making the others)
  return per_example_loss


@tf.autograph.experimental.do_not_convert
def check_per_example(name, losses, logits):
  """Raises ConfigError (at trace time) unless `losses` has shape [batch]."""
  shape = losses.shape
  batch = logits.shape[0] if logits.shape.rank else None
  if shape.rank != 1 or (batch is not None and shape[0] is not None and shape[0] != batch):
    raise ConfigError(f"loss '{name}' returned shape {shape.as_list() if shape.rank is not None else shape}; "
                      f"expected one loss per example, shape [{batch}] (do not reduce: the framework averages "
                      f"over the global batch)")

