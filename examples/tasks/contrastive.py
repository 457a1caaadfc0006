"""Contrastive pretraining (SimCLR's NT-Xent) with negatives from EVERY replica, and an online linear probe.

  python main.py --config=configs/tasks.py:contrastive --workdir=runs/contrastive

Runtime ~25 s on 2 CPU cores (600 steps); the linear probe on the frozen-by-stop-gradient embeddings reaches
eval/probe_accuracy ≈ 0.90 on digits, and eval/knn_accuracy (leave-one-out nearest neighbour over the whole eval
set's embeddings, gathered from every replica and worker: eval_collect + reduce_eval) ≈ 0.9.

Each replica embeds two noisy views of its rows, gathers every replica's embeddings (ctx.all_gather: gradients
flow back to their replica) and scores its rows against the whole global batch. With only the replica's own
rows as negatives the loss changes with the replica count (`main.py --check=replicas` fails it).
"""

import keras
import numpy as np
import tensorflow as tf

from loops.task import Task
from loops.task.classification import correct


def _encoder(shape):
  return keras.Sequential([
      keras.Input(shape), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
      keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
      keras.layers.Flatten(), keras.layers.Dense(64, activation="relu")], name="encoder")


class NtXent(Task):
  """Models: "model" (the encoder, exported), "projection" (the NT-Xent head), "probe" (10-way linear)."""

  train_metrics = ("contrastive_loss", "probe_accuracy")

  def __init__(self, temperature=0.2, noise=0.2):
    self.temperature, self.noise = temperature, noise

  def build_models(self, ctx):
    projection = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                   keras.layers.Dense(32)], name="projection")
    probe = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)], name="probe")
    return {"model": _encoder(ctx.features_spec.shape), "projection": projection, "probe": probe}

  def _view(self, images, ctx, salt):
    return images + self.noise * tf.cast(ctx.normal(tf.shape(images)[0], images.shape[1:], salt=salt), images.dtype)

  def per_example_loss(self, batch, models, ctx):
    images, labels = batch
    rows = tf.shape(images)[0]
    embed = lambda x: tf.math.l2_normalize(  # in the images' dtype (float32 under mixed_precision)
        tf.cast(models["projection"](models["model"](x, training=True)), images.dtype), -1)
    z_a, z_b = embed(self._view(images, ctx, 0)), embed(self._view(images, ctx, 1))
    all_a, all_b = ctx.all_gather(z_a), ctx.all_gather(z_b)  # [global batch, 32]: every replica's rows
    mine = ctx.global_rows(rows)  # each row's positive: the other view of the same global row
    self_mask = tf.one_hot(mine, tf.shape(all_a)[0], dtype=all_a.dtype) * -1e9
    nt_xent = lambda z, same, other: tf.nn.sparse_softmax_cross_entropy_with_logits(
        mine, tf.concat([z @ tf.transpose(other), z @ tf.transpose(same) + self_mask], 1) / self.temperature)
    contrastive = (nt_xent(z_a, all_a, all_b) + nt_xent(z_b, all_b, all_a)) / 2
    features = tf.stop_gradient(models["model"](images, training=True))
    probe_logits = tf.cast(models["probe"](features, training=True), images.dtype)
    ctx.log("contrastive_loss", contrastive)
    ctx.log("probe_accuracy", correct(labels, probe_logits))
    return contrastive + tf.nn.sparse_softmax_cross_entropy_with_logits(labels, probe_logits)

  eval_collect = ("embedding", "label")  # rows of the whole eval set, for reduce_eval
  eval_reduced = ("knn_accuracy",)

  def eval_step(self, batch, models, ctx):
    images, labels = batch
    embedding = models["model"](images, training=False)
    logits = tf.cast(models["probe"](embedding, training=False), images.dtype)
    return {"loss": tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits),
            "probe_accuracy": correct(labels, logits),
            "embedding": tf.math.l2_normalize(embedding, axis=-1), "label": labels}

  def reduce_eval(self, collected):
    """Leave-one-out nearest neighbour (cosine) among every eval example's embedding."""
    similarity = collected["embedding"] @ collected["embedding"].T
    np.fill_diagonal(similarity, -np.inf)
    labels = collected["label"]
    return {"knn_accuracy": float(np.mean(labels[similarity.argmax(axis=1)] == labels))}
