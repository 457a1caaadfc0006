"""Losses by name or import path, and the per-example contract.

Contract: a loss is `fn(labels, logits, **kwargs) -> per-example losses of shape [batch]` (this replica's
batch). The framework averages over the GLOBAL batch with tf.nn.compute_average_loss; a function that
reduces by itself would silently divide the gradient by the number of replicas, so it is rejected.
"""

import functools

import keras
import tensorflow as tf

from loops import plugins
from loops.errors import ConfigError, unknown_name


def sparse_categorical_crossentropy(labels, logits, label_smoothing=0.0):
  if label_smoothing:
    one_hot = tf.one_hot(tf.cast(labels, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)
    return keras.losses.categorical_crossentropy(
        one_hot, logits, from_logits=True, label_smoothing=label_smoothing)
  return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def multiclass_hinge(labels, logits):
  one_hot = tf.one_hot(tf.cast(labels, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)
  return keras.losses.categorical_hinge(one_hot, logits)


def focal(labels, logits, gamma=2.0, alpha=0.25):
  """Focal loss (Lin et al. 2017) on one-hot targets, one value per example."""
  one_hot = tf.one_hot(tf.cast(labels, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)
  return keras.losses.categorical_focal_crossentropy(one_hot, logits, alpha=alpha, gamma=gamma, from_logits=True)


LOSSES = {
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy,
    "focal": focal,
    "multiclass_hinge": multiclass_hinge,
}


def build(loss_config):
  """Returns fn(labels, logits) -> per-example losses, checked against the contract when traced."""
  name = loss_config.name
  kwargs = dict(loss_config.kwargs)
  if plugins.is_import_path(name):
    fn = plugins.load_callable(name, "loss.name", 2)
  elif name in LOSSES:
    fn = LOSSES[name]
    if name == "sparse_categorical_crossentropy":
      kwargs.setdefault("label_smoothing", loss_config.label_smoothing)
  else:
    raise unknown_name("loss", name, list(LOSSES) + ["package.module:function"])
  bound = functools.partial(fn, **kwargs)

  def per_example_loss(labels, logits):
    losses = bound(labels, logits)
    check_per_example(name, losses, logits)
    return tf.cast(losses, tf.float32)

  return per_example_loss


def validate(loss_fn, num_classes, batch=4):
  """Calls the loss eagerly on a dummy batch, so a broken loss fails here with its message, not inside a trace."""
  loss_fn(tf.zeros([batch], tf.int64), tf.zeros([batch, num_classes], tf.float32))


def check_per_example(name, losses, logits):
  """Raises ConfigError (at trace time) unless `losses` has shape [batch]."""
  shape = losses.shape
  batch = logits.shape[0]
  if shape.rank != 1 or (batch is not None and shape[0] is not None and shape[0] != batch):
    raise ConfigError(f"loss '{name}' returned shape {shape.as_list() if shape.rank is not None else shape}; "
                      f"expected one loss per example, shape [{batch}] (do not reduce: the framework averages "
                      f"over the global batch)")

