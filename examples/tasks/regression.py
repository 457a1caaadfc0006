"""Regression with float targets: a digit's value (0.0 .. 9.0) from its image, squared-error loss (loss level),
eval/mae and eval/mse, the best checkpoint by eval/mae (min).

  python main.py --config=configs/tasks.py:regression --workdir=runs/regression

Runtime ~15 s on 2 CPU cores (1 000 steps, Adam at 3e-3); reaches eval/mae ≈ 0.56 (a constant guess of the mean
scores 2.5; the squared error pulls confusable digits, say 4 and 9, towards their middle).
"""

import keras
import tensorflow as tf

from examples.tasks import digits
from loops.task import Task


def digit_values(split):
  """data.name=examples.tasks.regression:digit_values — (images, float32 digit values)."""
  images, labels = digits.images_and_labels(split)
  return images, labels.astype("float32")


class DigitValue(Task):
  """Predicts one float per image."""

  def build_models(self, ctx):
    model = keras.Sequential([
        keras.Input(ctx.features_spec.shape),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1),
    ], name="value_regressor")
    return {"model": model}

  def per_example_loss(self, batch, models, ctx):
    images, values = batch
    # the model's outputs in the targets' dtype (bfloat16 under mixed_precision)
    predicted = tf.cast(tf.squeeze(models["model"](images, training=ctx.training), -1), values.dtype)
    return tf.square(predicted - values)  # one loss per example: the framework averages over the GLOBAL batch

  def predict_step(self, batch, models, ctx):
    """mode=predict writes each image's value (workdir/predictions/<split>-<step>/part-*.npz, key "value")."""
    return {"value": tf.squeeze(models["model"](batch[0], training=False), -1)}

  def eval_step(self, batch, models, ctx):
    images, values = batch
    error = tf.cast(tf.squeeze(models["model"](images, training=False), -1), values.dtype) - values
    return {"loss": tf.square(error), "mse": tf.square(error), "mae": tf.abs(error)}
