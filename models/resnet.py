"""Residual networks: Keras' ResNet V2 applications (random init, or ImageNet weights from Keras' cache) and a small
CIFAR ResNet-20."""

import os

import keras
from keras import layers

from errors import ConfigError

# Keras' download location for its application weights (keras/src/applications/resnet.py).
WEIGHTS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/resnet/"


def _check_min_size(name, input_shape, minimum):
  if min(input_shape[:2]) < minimum:
    raise ValueError(f"model '{name}' needs images of at least {minimum}x{minimum}, got {input_shape[:2]}; "
                     f"set data.image_size")


def resnet50v2(input_shape, num_classes, weights=None):
  """Keras' ResNet50V2; weights="imagenet": its ImageNet body (from Keras' cache) with a new `logits` head."""
  _check_min_size("resnet50v2", input_shape, 32)
  return _resnet_v2(keras.applications.ResNet50V2, "resnet50v2", input_shape, num_classes, weights)


def resnet152v2(input_shape, num_classes, weights=None):
  """Keras' ResNet152V2; weights="imagenet" as resnet50v2."""
  _check_min_size("resnet152v2", input_shape, 32)
  return _resnet_v2(keras.applications.ResNet152V2, "resnet152v2", input_shape, num_classes, weights)


def _resnet_v2(application, name, input_shape, num_classes, weights):
  if weights is None:
    return application(weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)
  if weights != "imagenet":
    raise ConfigError(f"model.kwargs.weights for {name} must be None or 'imagenet', got {weights!r} (other files: "
                      f"init.checkpoint)")
  body = application(include_top=False, weights=imagenet_weights_file(name), input_shape=input_shape,
                     pooling="avg")
  logits = layers.Dense(num_classes, dtype="float32", name="logits")(body.output)
  return keras.Model(body.input, logits, name=name)


def keras_cache_dirs():
  """Where keras.utils.get_file keeps application weights: $KERAS_HOME/models or ~/.keras/models (/tmp/.keras
  when the home directory is not writable)."""
  home = os.path.expanduser("~")
  homes = [os.environ["KERAS_HOME"]] if "KERAS_HOME" in os.environ else [os.path.join(home, ".keras")]
  return [os.path.join(h, "models") for h in homes + ["/tmp/.keras"]]


def imagenet_weights_file(name):
  """The cached ImageNet weights (no top) of Keras' `name` application; ConfigError saying which file to place
  where (and its URL) when it is not there: this machine may have no network."""
  file_name = f"{name}_weights_tf_dim_ordering_tf_kernels_notop.h5"
  for directory in keras_cache_dirs():
    if os.path.exists(os.path.join(directory, file_name)):
      return os.path.join(directory, file_name)
  raise ConfigError(f"ImageNet weights for {name} are not in Keras' cache: place {file_name} in "
                    f"{keras_cache_dirs()[0]}/ (download {WEIGHTS_URL}{file_name} on a machine with network)")


def cifar_resnet20(input_shape, num_classes, blocks_per_stage=3):
  """He et al.'s CIFAR ResNet (6n+2 layers; n=3 gives ResNet-20, ~0.27 M parameters)."""

  def block(x, filters, stride):
    shortcut = x
    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != filters:
      shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
      shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))

  inputs = keras.Input(input_shape)
  x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
  x = layers.ReLU()(layers.BatchNormalization()(x))
  for stage, filters in enumerate((16, 32, 64)):
    for i in range(blocks_per_stage):
      x = block(x, filters, stride=2 if stage > 0 and i == 0 else 1)
  x = layers.GlobalAveragePooling2D()(x)
  outputs = layers.Dense(num_classes, dtype="float32", name="logits")(x)
  return keras.Model(inputs, outputs, name="cifar_resnet20")
