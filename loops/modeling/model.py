"""The model: resolved by name or import path, built under the precision policy, optionally with synchronized
BatchNorm, and called through one function that gives (logits, outputs) whatever the model returns."""

import contextlib

from absl import logging
import keras
import tensorflow as tf

from errors import ConfigError
from loops.core import plugins
from loops.modeling import fused_batchnorm
from loops import private_apis
import models

MIXED_PRECISION_POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
SETTING = "model.name"
# CPU flags (Linux /proc/cpuinfo) of the units that run each precision at speed (oneDNN uses them). float16: none.
# TensorFlow 2.21's float16 Conv2DBackpropFilter on CPU is Eigen's fallback even with AVX512_FP16 and AMX: measured
# 2026-11-30 on such a VM, 0.5-2.5 s a call against 3-11 ms in float32 and 2-4 ms in bfloat16.
NATIVE_CPU_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ()}
# Measured with main.py on digits_cnn: 2026-11-24 on a 2-core AVX2 VM, float32 9 509, float16 2 978, bfloat16 1 069
# images/s; 2026-11-30 on an AVX512_FP16/AMX VM, 40 steps in 5.8 s (float32), 3.6 s (bfloat16), 54.5 s (float16).
SLOW_ON_CPU = {
    "bfloat16": ("its CPU has none of avx512_bf16/amx_bf16, so it is emulated, slower than float32 (digits: 9x on an "
                 "AVX2 machine)"),
    "float16": ("TensorFlow has no fast float16 convolution gradient on any CPU: slower than float32 (digits: 3x on an "
                "AVX2 machine, 9x on an AVX512_FP16/AMX one)"),
}
CPU_MIXED_PRECISION_WARNING = "mixed_precision=%r on a machine without GPU: %s; use it here to check a GPU config"


def cpu_flags(cpuinfo_path="/proc/cpuinfo"):
  """The CPU's feature flags, or an empty set where the file is missing (not Linux)."""
  try:
    with open(cpuinfo_path) as cpuinfo:
      return {flag for line in cpuinfo if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
  except OSError:
    return set()


def emulated_on_cpu(precision, flags):
  """True when `precision` has no unit among the CPU `flags` that runs it at speed (then it is slower than
  float32)."""
  return bool(precision) and not set(NATIVE_CPU_FLAGS[precision]) & flags


def model_function(name):
  """The function behind model.name: a registry entry or a "package.module:function" import."""
  if plugins.is_import_path(name):
    return plugins.load_callable(name, SETTING, 2)
  return models.get(name)


@contextlib.contextmanager
def precision_policy(mixed_precision):
  """Keras' dtype policy of `mixed_precision` for the models built inside (restored afterwards: it is global; None:
  the policy as it is). Entering it where the CPU emulates that precision logs a warning once per build."""
  previous = keras.mixed_precision.dtype_policy()
  policy = MIXED_PRECISION_POLICIES.get(mixed_precision)
  if policy and previous.name != policy:
    if not tf.config.list_physical_devices("GPU") and emulated_on_cpu(mixed_precision, cpu_flags()):
      logging.warning(CPU_MIXED_PRECISION_WARNING, mixed_precision, SLOW_ON_CPU[mixed_precision])
    keras.mixed_precision.set_dtype_policy(policy)
  try:
    yield
  finally:
    keras.mixed_precision.set_dtype_policy(previous)


def build_model(model_settings, mixed_precision, input_shape, num_classes):
  """The model of the `model` settings under the Keras dtype policy of `mixed_precision` (restored afterwards: it
  is global); its BatchNormalization layers synchronized over all replicas when model.sync_batchnorm, the others
  run through the fused kernel when model.fused_batchnorm (loops/modeling/fused_batchnorm.py). Call in
  strategy.scope()."""
  with precision_policy(mixed_precision):
    model = model_function(model_settings.name)(tuple(input_shape), int(num_classes), **dict(model_settings.kwargs))
  if not isinstance(model, keras.Model):
    raise ConfigError(f"model '{model_settings.name}' returned {type(model).__name__}, not a keras.Model")
  configure_batchnorm(model, model_settings)
  return model


def configure_batchnorm(model, model_config):
  """model.sync_batchnorm, then model.fused_batchnorm for the layers left (a synchronized one is never fused), on
  any Keras model: the config's and every model a task builds. Layers done before are left as they are."""
  if model_config.sync_batchnorm:
    synchronized = synchronize_batchnorm(model)
    if synchronized:
      logging.info("synchronized BatchNorm: %d layers of %s", synchronized, model.name)
  if model_config.fused_batchnorm:
    fused = fused_batchnorm.fuse(model)
    if fused:
      logging.info("fused BatchNorm: %d layers of %s", fused, model.name)


def synchronize_batchnorm(model):
  """Makes every BatchNormalization of `model` (nested ones too) compute its batch statistics over the global
  batch: Keras' synchronized=True (one all-reduce each of sum, sum of squares and count per layer and step;
  gradients flow through them). Returns how many layers it changed."""
  layers = [l for l in private_apis.all_layers(model)
            if isinstance(l, keras.layers.BatchNormalization) and not l.synchronized]
  for layer in layers:
    layer.synchronized = True  # read at call time by the layer's moments
  return len(layers)


def synchronized_layers(model):
  """The BatchNormalization layers of `model` (nested ones too) that compute statistics over every replica."""
  return [l for l in private_apis.all_layers(model)
          if isinstance(l, keras.layers.BatchNormalization) and l.synchronized]


def logits_model(model):
  """A model that outputs only the logits (for the export), when `model` is functional with a dict output."""
  try:
    output = model.output  # symbolic models only
  except (AttributeError, ValueError):
    return model
  if isinstance(output, dict) and "logits" in output:
    return keras.Model(model.inputs, output["logits"], name=model.name)
  return model
