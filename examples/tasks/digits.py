"""scikit-learn's bundled digits as arrays for the example tasks: float images in [0, 1] and class ids.

The same fixed stratified 80/20 split as the built-in `data.name=digits` source."""

import keras
import numpy as np
from sklearn import datasets
from sklearn import model_selection
import tensorflow as tf

from loops.task import Task


def images_and_labels(split):
  """(float32 images [N, 8, 8, 1] in [0, 1], int64 labels [N]) of split "train" or "eval"."""
  digits = datasets.load_digits()
  images = (digits.images / 16.0).astype(np.float32)[..., None]
  labels = digits.target.astype(np.int64)
  train_x, eval_x, train_y, eval_y = model_selection.train_test_split(
      images, labels, test_size=0.2, random_state=0, stratify=labels)
  return (train_x, train_y) if split == "train" else (eval_x, eval_y)


def classification(split):
  """data.name=examples.tasks.digits:classification — (images, class ids)."""
  return images_and_labels(split)


def batches(split, *, batch_size, context, seed, epoch):
  """data.name=examples.tasks.digits:batches — the same (images, class ids) from an input function: this input
  pipeline's batches of one epoch, in an order keyed on (seed, epoch), sharded before batching (data/user_stream.py
  says why); any worker or replica count then sees the same global batches, and resume is exact."""
  images, labels = images_and_labels(split)
  ds = tf.data.Dataset.from_tensor_slices((images, labels))
  if split == "train":
    order = tf.random.experimental.stateless_shuffle(tf.range(len(labels), dtype=tf.int64), seed=[seed, epoch])
    ds = tf.data.Dataset.from_tensor_slices(order).map(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
    ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
  return ds.batch(batch_size, drop_remainder=split == "train")


class Classifier(Task):
  """The built-in classification written as a user's loss-level task (the same loss and train/accuracy), for
  measuring what the contract costs a user's task (docs/performance.md):

    python main.py --config=configs/digits_cnn.py --workdir=runs/digits-task \\
        --config.task.name=examples.tasks.digits:Classifier
  """

  train_metrics = ("accuracy",)

  def per_example_loss(self, batch, models, ctx):
    images, labels = batch
    logits = tf.cast(models["model"](images, training=ctx.training), images.dtype)
    ctx.log("accuracy", tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32))
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)  # the built-in's loss

  def eval_step(self, batch, models, ctx):
    images, labels = batch
    logits = tf.cast(models["model"](images, training=False), images.dtype)
    return {"loss": keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True),
            "accuracy": tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32)}
