"""Optimizers by name and the learning-rate scaling rules, derived from the final batch and replica count."""

import math

import keras

from loops.errors import ConfigError, unknown_name

LR_SCALING = {
    "none": lambda lr, global_batch, replicas: lr,
    "linear_replicas": lambda lr, global_batch, replicas: lr * replicas,  # the seeds' rule
    "linear_batch_256": lambda lr, global_batch, replicas: lr * global_batch / 256,
    "sqrt_replicas": lambda lr, global_batch, replicas: lr * math.sqrt(replicas),
}
OPTIMIZERS = ("sgd", "adam", "adamw")


def scaled_learning_rate(opt_config, global_batch_size, replicas):
  rule = opt_config.lr_scaling
  if rule not in LR_SCALING:
    raise unknown_name("optimizer.lr_scaling rule", rule, LR_SCALING)
  if not opt_config.learning_rate > 0:
    raise ConfigError(f"optimizer.learning_rate must be > 0, got {opt_config.learning_rate}")
  return float(LR_SCALING[rule](opt_config.learning_rate, global_batch_size, replicas))


def build(opt_config, learning_rate):
  """A Keras optimizer; create it inside strategy.scope() and build() it there before the first step."""
  name = opt_config.name
  common = dict(learning_rate=learning_rate, global_clipnorm=opt_config.global_clipnorm)
  if name == "sgd":
    return keras.optimizers.SGD(momentum=opt_config.momentum, nesterov=opt_config.nesterov,
                                weight_decay=opt_config.weight_decay, **common)
  if name == "adam":
    return keras.optimizers.Adam(weight_decay=opt_config.weight_decay, **common)
  if name == "adamw":
    return keras.optimizers.AdamW(weight_decay=opt_config.weight_decay or 0.004, **common)
  raise unknown_name("optimizer", name, OPTIMIZERS)
