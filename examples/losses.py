"""Losses that read more than (labels, logits). The framework passes exactly the keywords a loss declares:
`outputs` (the model's output dict), `images` (this replica's preprocessed batch), `step` (global step, int64).

An embedding-norm penalty (uses `outputs`):

    python main.py --config=configs/digits_cnn.py --workdir=runs/norm \
        --config.model.name=examples.models:cnn_with_embedding \
        --config.loss.name=examples.losses:embedding_norm_penalty --config.loss.kwargs.weight=0.001

An auxiliary reconstruction loss, ramped in over the first steps (uses `images`, `outputs` and `step`):

    python main.py --config=configs/digits_cnn.py --workdir=runs/aux \
        --config.model.name=examples.models:cnn_with_embedding --config.model.kwargs.reconstruct=True \
        --config.loss.name=examples.losses:reconstruction_auxiliary

Expected (2-core CPU, ~12 s each with start-up): eval/accuracy >= 0.95 (measured 0.992 and 0.983). Both return one loss per example and do not reduce: the
framework averages over the GLOBAL batch, so any number of replicas computes the same update.
"""

import tensorflow as tf


def _cross_entropy(labels, logits):
  if labels.shape.rank == 2:  # soft labels (mixup/cutmix)
    return tf.nn.softmax_cross_entropy_with_logits(labels, logits)
  return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(labels, tf.int32), logits)


def embedding_norm_penalty(labels, logits, outputs, weight=1e-3):
  """Cross-entropy + weight * ||embedding||^2 per example (keeps features small; a common metric-learning aid)."""
  embedding = tf.cast(outputs["embedding"], tf.float32)
  return _cross_entropy(labels, logits) + weight * tf.reduce_sum(tf.square(embedding), axis=-1)


def reconstruction_auxiliary(labels, logits, images, outputs, step, weight=0.5, ramp_steps=200):
  """Cross-entropy + w(step) * mean squared reconstruction error of the input, w ramping linearly from 0 to
  `weight` over `ramp_steps` (needs cnn_with_embedding(reconstruct=True))."""
  error = tf.reduce_mean(tf.square(tf.cast(outputs["reconstruction"], tf.float32) - images), axis=[1, 2, 3])
  ramp = tf.minimum(1.0, tf.cast(step, tf.float32) / float(ramp_steps))
  return _cross_entropy(labels, logits) + weight * ramp * error
