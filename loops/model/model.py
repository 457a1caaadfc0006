"""The model: resolved by name or import path, built under the precision policy, optionally with synchronized
BatchNorm, and called through one function that gives (logits, outputs) whatever the model returns."""

from absl import logging
import keras
import tensorflow as tf

from errors import ConfigError
from loops.core import plugins
from loops.model import fused_batchnorm
import models

MIXED_PRECISION_POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
SETTING = "model.name"


def model_function(name):
  """The function behind model.name: a registry entry or a "package.module:function" import."""
  if plugins.is_import_path(name):
    return plugins.load_callable(name, SETTING, 2)
  return models.get(name)


def build_model(config, input_shape, num_classes):
  """The model under config.mixed_precision's Keras dtype policy (restored afterwards: it is global); its
  BatchNormalization layers synchronized over all replicas when model.sync_batchnorm, the others run through the
  fused kernel when model.fused_batchnorm (loops/model/fused_batchnorm.py). Call in strategy.scope()."""
  if config.mixed_precision == "float16" and not tf.config.list_physical_devices("GPU"):
    logging.warning("mixed_precision='float16' on a machine without GPU is emulated and ~100x slower than "
                    "float32 (measured: 47 vs 6 400 images/s on digits); use 'bfloat16' on CPUs")
  previous = keras.mixed_precision.dtype_policy()
  if config.mixed_precision:
    keras.mixed_precision.set_dtype_policy(MIXED_PRECISION_POLICIES[config.mixed_precision])
  try:
    model = model_function(config.model.name)(tuple(input_shape), int(num_classes), **dict(config.model.kwargs))
  finally:
    keras.mixed_precision.set_dtype_policy(previous)
  if not isinstance(model, keras.Model):
    raise ConfigError(f"model '{config.model.name}' returned {type(model).__name__}, not a keras.Model")
  configure_batchnorm(model, config.model)
  return model


def configure_batchnorm(model, model_config):
  """model.sync_batchnorm, then model.fused_batchnorm for the layers left (a synchronized one is never fused)."""
  if model_config.sync_batchnorm:
    logging.info("synchronized BatchNorm: %d layers", synchronize_batchnorm(model))
  if model_config.fused_batchnorm:
    fused = fused_batchnorm.fuse(model)
    if fused:
      logging.info("fused BatchNorm: %d layers", fused)


def synchronize_batchnorm(model):
  """Makes every BatchNormalization of `model` (nested ones too) compute its batch statistics over the global
  batch: Keras' synchronized=True (one all-reduce each of sum, sum of squares and count per layer and step;
  gradients flow through them). Returns how many layers."""
  layers = [l for l in model._flatten_layers() if isinstance(l, keras.layers.BatchNormalization)]  # pylint: disable=protected-access
  for layer in layers:
    layer.synchronized = True  # read at call time by the layer's moments
  return len(layers)


def logits_model(model):
  """A model that outputs only the logits (for the export), when `model` is functional with a dict output."""
  try:
    output = model.output  # symbolic models only
  except (AttributeError, ValueError):
    return model
  if isinstance(output, dict) and "logits" in output:
    return keras.Model(model.inputs, output["logits"], name=model.name)
  return model
