"""Residual networks: Keras' ResNet V2 applications (random init) and a small CIFAR ResNet-20."""

import keras
from keras import layers


def _check_min_size(name, input_shape, minimum):
  if min(input_shape[:2]) < minimum:
    raise ValueError(f"model '{name}' needs images of at least {minimum}x{minimum}, got {input_shape[:2]}; "
                     f"set data.image_size")


def resnet50v2(input_shape, num_classes):
  _check_min_size("resnet50v2", input_shape, 32)
  return keras.applications.ResNet50V2(
      weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)


def resnet152v2(input_shape, num_classes):
  _check_min_size("resnet152v2", input_shape, 32)
  return keras.applications.ResNet152V2(
      weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)


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
  outputs = layers.Dense(num_classes, dtype="float32")(x)
  return keras.Model(inputs, outputs, name="cifar_resnet20")
