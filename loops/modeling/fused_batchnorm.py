"""BatchNormalization through TensorFlow's fused kernel (FusedBatchNormV3: one op forward, one backward).

Keras 3 runs BatchNormalization in training as separate ops (moments, then normalize: about ten passes over the
activations forward and backward); tf.keras 2 used the fused kernel. `fuse(model)` gives every eligible layer a
call that normalises a training batch through the fused op, by the batch's statistics, and updates the moving
averages with the biased batch variance exactly as Keras does. Inference (and a frozen layer) stays Keras' own
call: one affine op either way, and the fused kernel's inference-mode gradient is not deterministic on GPUs.
The layers, their variables, checkpoints and the saved model stay Keras' own (it reloads without this module).
Measured on a 2-core CPU (batch 128, side by side): a ResNet-20 training step 1.27-1.49x faster.

Eligible: keras.layers.BatchNormalization (a subclass with its own `call` or `_moments` keeps them), not synchronized
(model.sync_batchnorm), no renorm, normalising the last axis. At call time a mask, or an input dtype the kernel
does not take, goes through Keras' own call.
"""

import keras
import tensorflow as tf

from loops import private_apis

FUSED_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


def eligible(layer):
  """True when `layer` is a BatchNormalization whose computation the fused kernel reproduces."""
  keras_class, own = keras.layers.BatchNormalization, type(layer)
  return (isinstance(layer, keras_class)
          and own.call is keras_class.call and not private_apis.overrides_moments(layer)
          and not layer.synchronized and not layer.renorm and layer.axis in (-1, _last_axis(layer)))


def _last_axis(layer):
  spec = getattr(layer, "input_spec", None)
  return spec.ndim - 1 if spec is not None and spec.ndim else -1


def fuse(model):
  """Gives every eligible BatchNormalization of `model` (nested ones too) the fused call. Returns how many it
  changed (a layer already fused is left as it is)."""
  layers = [l for l in private_apis.all_layers(model) if eligible(l) and not getattr(l.call, "fused", False)]
  for layer in layers:
    layer.call = fused_call(layer)  # an instance attribute: the class (and so the saved model) stays Keras'
  return len(layers)


def fused_layers(model):
  """How many of `model`'s layers run through the fused kernel."""
  return sum(1 for l in private_apis.all_layers(model) if getattr(l.call, "fused", False))


def fused_call(layer):
  """The layer's call through FusedBatchNormV3; Keras' own call where the kernel does not apply."""
  keras_call = type(layer).call.__get__(layer)

  def call(inputs, training=None, mask=None):
    inputs = tf.convert_to_tensor(inputs)
    rank = inputs.shape.rank
    if (not (training and layer.trainable) or mask is not None or inputs.dtype not in FUSED_DTYPES
        or rank is None or rank < 2 or layer.axis not in (-1, rank - 1) or layer.synchronized or layer.renorm):
      return keras_call(inputs, training=training, mask=mask)
    x = inputs if rank == 4 else tf.reshape(inputs, [-1, 1, 1, inputs.shape[-1]])
    channels = inputs.shape[-1]
    scale = tf.cast(layer.gamma, tf.float32) if layer.scale else tf.ones([channels], tf.float32)
    offset = tf.cast(layer.beta, tf.float32) if layer.center else tf.zeros([channels], tf.float32)
    y = _normalize_with_batch_statistics(layer, x, scale, offset)
    return tf.cast(y if rank == 4 else tf.reshape(y, tf.shape(inputs)), layer.compute_dtype)

  call.fused = True
  return call


def _normalize_with_batch_statistics(layer, x, scale, offset):
  """Training mode: normalise by the batch's statistics and update the moving averages as Keras does."""
  empty = tf.constant([], tf.float32)
  y, mean, variance = tf.raw_ops.FusedBatchNormV3(
      x=x, scale=scale, offset=offset, mean=empty, variance=empty, epsilon=layer.epsilon, is_training=True)[:3]
  count = tf.cast(tf.size(x) // tf.shape(x)[-1], tf.float32)
  # The kernel returns the unbiased variance (cuDNN: NaN for one value per channel); Keras averages the biased one.
  variance = tf.where(count > 1.0, variance * (count - 1.0) / count, tf.zeros_like(variance))
  momentum = layer.momentum
  layer.moving_mean.assign(tf.cast(layer.moving_mean, tf.float32) * momentum + mean * (1.0 - momentum))
  layer.moving_variance.assign(
      tf.cast(layer.moving_variance, tf.float32) * momentum + variance * (1.0 - momentum))
  return y
