"""Small convolutional networks (no dropout or other random layers: resume and replicas stay exact)."""

import keras
from keras import layers


def mnist_cnn(input_shape, num_classes):
  """The seeds' MNIST CNN: conv 32 5x5 -> pool -> conv 64 5x5 -> pool -> dense 1024 -> logits."""
  return keras.Sequential([
      keras.Input(input_shape),
      layers.Conv2D(32, 5, padding="same", activation="relu"),
      layers.MaxPooling2D(2),
      layers.Conv2D(64, 5, padding="same", activation="relu"),
      layers.MaxPooling2D(2),
      layers.Flatten(),
      layers.Dense(1024, activation="relu"),
      layers.Dense(num_classes, dtype="float32", name="logits"),
  ], name="mnist_cnn")


def digits_cnn(input_shape, num_classes, hidden=128):
  """A small CNN for 8x8 digits: conv 32 3x3 -> conv 64 3x3 -> pool -> dense `hidden` -> logits.

  Its layers are named (digits_cnn/conv1, conv2, dense, logits) so that train.freeze and init.exclude patterns
  read the same in every process."""
  return keras.Sequential([
      keras.Input(input_shape),
      layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1"),
      layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2"),
      layers.MaxPooling2D(2, name="pool"),
      layers.Flatten(name="flatten"),
      layers.Dense(hidden, activation="relu", name="dense"),
      layers.Dense(num_classes, dtype="float32", name="logits"),
  ], name="digits_cnn")
