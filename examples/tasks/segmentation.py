"""Dense per-pixel targets: segment generated 16x16 images into background, squares and discs; mean IoU over the
whole eval set (Keras' MeanIoU: a confusion matrix summed over every replica and worker).

  python main.py --config=configs/tasks.py:segmentation --workdir=runs/segmentation

Runtime ~20 s on 2 CPU cores (400 steps); reaches eval/mean_iou ≈ 0.98 and eval/pixel_accuracy ≈ 0.997 (background everywhere: mean IoU 0.27).
"""

import keras
import numpy as np
import tensorflow as tf

from loops.task import Task

SIZE, CLASSES = 16, 3


def shapes(split):
  """data.name=examples.tasks.segmentation:shapes — (float32 images [N, 16, 16, 1], int32 masks [N, 16, 16]):
  one square (class 1) and one disc (class 2) per image on a noisy background; fixed seeds per split."""
  rng = np.random.default_rng(0 if split == "train" else 1)
  count = 1200 if split == "train" else 300
  images = rng.normal(0.2, 0.1, (count, SIZE, SIZE)).astype(np.float32)
  masks = np.zeros((count, SIZE, SIZE), np.int32)
  yy, xx = np.mgrid[:SIZE, :SIZE]
  for i in range(count):
    side, (top, left) = rng.integers(3, 7), rng.integers(0, SIZE - 6, 2)
    masks[i, top:top + side, left:left + side] = 1
    radius, (cy, cx) = rng.integers(2, 4), rng.integers(3, SIZE - 3, 2)
    masks[i][(yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2] = 2
  images += np.where(masks == 1, 0.5, np.where(masks == 2, 0.8, 0.0)).astype(np.float32)
  return images[..., None], masks


class Shapes(Task):
  """A small fully convolutional net; per-example loss = the mean of its pixels' cross-entropies."""

  def build_models(self, ctx):
    model = keras.Sequential([
        keras.Input(ctx.features_spec.shape),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", dilation_rate=2),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(CLASSES, 1)], name="segmenter")
    return {"model": model}

  def per_example_loss(self, batch, models, ctx):
    images, masks = batch
    logits = models["model"](images, training=ctx.training)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(masks, logits), axis=[1, 2])

  def predict_step(self, batch, models, ctx):
    """Each pixel's class ("mask") and its class probabilities: what the export serves."""
    logits = models["model"](batch[0], training=False)
    return {"mask": tf.argmax(logits, -1, output_type=tf.int32), "probabilities": tf.nn.softmax(logits)}

  def build_metrics(self):
    return {"mean_iou": keras.metrics.MeanIoU(num_classes=CLASSES, name="mean_iou")}

  def eval_step(self, batch, models, ctx):
    images, masks = batch
    logits = models["model"](images, training=False)
    predicted = tf.argmax(logits, -1, output_type=tf.int32)
    pixel_weights = tf.broadcast_to(ctx.weights[:, None, None], tf.shape(masks))  # padding rows count nothing
    ctx.metrics["mean_iou"].update_state(masks, predicted, sample_weight=pixel_weights)
    return {"loss": tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(masks, logits), axis=[1, 2]),
            "pixel_accuracy": tf.reduce_mean(tf.cast(tf.equal(predicted, masks), tf.float32), axis=[1, 2])}
