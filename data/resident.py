"""Device-resident training input: an in-memory train split lives on every replica's device once, and each step
gathers its batch there by index inside the compiled loop (no per-step iterator hand-off from the host).

The batches are those of data/pipeline.py's host stream for the same seed: epoch e is `epoch_order(seed, e)`,
step s of the epoch takes rows [s * G, (s + 1) * G) of it (G = global batch), replica r takes its contiguous
share (as tf.distribute splits a global batch), and random flips use the same per-row draws keyed on the step.
So resume is exact at any step (the batch is a function of the step counter), and 1 or N replicas see the same
examples; under multi_worker_mirrored worker w takes the permutation's shard w::W as its host pipeline does.
Parameter servers and mixup/cutmix keep the host pipeline (a log line says so).
"""

import dataclasses

import numpy as np
import tensorflow as tf

from data import mixing
from data import pipeline

CHOICES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class Residency:
  resident: bool
  reason: str  # why (not)
  bytes_per_device: int  # the train split's images + labels (0 when streamed)


def decide(source, data_config, *, synchronous):
  """Whether this run's train split lives on the devices (data.device_resident, data.device_resident_max_bytes)."""
  mode = data_config.device_resident
  if mode == "off":
    return Residency(False, "data.device_resident=off", 0)
  if source.train_arrays is None:
    return Residency(False, f"dataset '{source.name}' is streamed (not held in memory)", 0)
  size = resident_bytes(source, data_config)
  budget = int(data_config.device_resident_max_bytes)
  blockers = [(size > budget, f"the train split ({size / 2**20:.1f} MiB) is larger than "
                              f"data.device_resident_max_bytes ({budget / 2**20:.1f} MiB)"),
              (not synchronous, "parameter-server workers read their own datasets"),
              (mixing.mixes(data_config), "mixup/cutmix run in the host pipeline")]
  for blocked, reason in blockers:
    if blocked:
      return Residency(False, reason, 0)
  return Residency(True, f"the train split ({size / 2**20:.1f} MiB) fits data.device_resident_max_bytes", size)


def resident_bytes(source, data_config):
  """Bytes per device: the split preprocessed once (float32 images after resize and normalisation) + labels."""
  images, labels = source.train_arrays
  height, width, channels = pipeline.output_shape(source, data_config)
  return len(labels) * height * width * channels * 4 + np.asarray(labels).nbytes


class ResidentTrainData:
  """The train split on every replica's device (a mirrored, non-trainable variable) and the per-step gather."""

  def __init__(self, strategy, source, data_config, *, global_batch_size, steps_per_epoch, seed, num_workers=1,
               worker_index=0):
    images, labels = source.train_arrays
    # Scaled, resized and normalised once (not per step); only the flips, keyed per step, remain per batch.
    images = pipeline.make_preprocess(source, data_config, training=False)(images, labels, 0)[0]
    with strategy.scope():
      self.images = tf.Variable(images, trainable=False, name="resident_images")
      self.labels = tf.Variable(labels, trainable=False, name="resident_labels")
    self.size, self.seed = len(labels), seed
    self.global_batch, self.steps_per_epoch = global_batch_size, steps_per_epoch
    self.replicas = strategy.num_replicas_in_sync
    self.per_replica = global_batch_size // self.replicas
    self.workers, self.worker = num_workers, worker_index
    self.local_replicas = self.replicas // num_workers
    self.flips = data_config.random_flip

  def call_indices(self, first_step, num_steps):
    """Cross-replica context: [num_steps, L * B] rows of this worker's batches for the steps of one call, local
    replica by local replica (computed once per call: each epoch's permutation the call touches, then one gather).

    One worker: step j of an epoch takes rows [j G, (j + 1) G) of the permutation (tf.distribute splits a global
    batch by replica). W workers: the host pipeline of worker w reads the permutation's shard w::W in batches of B
    (per replica), handing consecutive batches to its L local replicas: step j takes batches jL .. jL + L - 1.
    """
    steps = tf.cast(first_step, tf.int64) + tf.range(tf.cast(num_steps, tf.int64))
    epochs, within = steps // self.steps_per_epoch, steps % self.steps_per_epoch
    first_epoch = epochs[0]
    orders = tf.map_fn(lambda epoch: pipeline.epoch_order(self.seed, epoch, self.size),
                       tf.range(first_epoch, epochs[-1] + 1), fn_output_signature=tf.int64)
    if self.workers > 1:
      orders = orders[:, self.worker::self.workers]
    rows = self.local_replicas * self.per_replica
    columns = within[:, tf.newaxis] * rows + tf.range(rows, dtype=tf.int64)[tf.newaxis, :]
    return tf.gather(tf.gather(orders, epochs - first_epoch), columns, batch_dims=1)

  def global_indices(self, step):
    """Cross-replica context: this worker's rows of the batch of `step` (call_indices for one step)."""
    return self.call_indices(step, 1)[0]

  def replica_batch(self, indices, step):
    """Replica context: this replica's (preprocessed images, labels) of the global batch `indices` of `step`."""
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    local = tf.cast(replica - self.worker * self.local_replicas, tf.int64)
    start = local * self.per_replica
    mine = indices[start:start + self.per_replica]
    images, labels = tf.gather(self.images, mine), tf.gather(self.labels, mine)
    if self.flips:
      images = pipeline.flip_rows(images, self._draws(tf.cast(step, tf.int64), local, start))
    return images, labels

  def _draws(self, step, local, start):
    """The host pipeline's flip draws for this replica's rows: one worker keys the global batch by step;
    worker w of W keys each local batch by its place in the worker's stream and takes rows w::W."""
    if self.workers == 1:
      return pipeline.flip_draws(self.seed, step, self.global_batch)[start:start + self.per_replica]
    key = step * self.local_replicas + local
    return pipeline.flip_draws(self.seed, key, self.per_replica * self.workers)[self.worker::self.workers]
