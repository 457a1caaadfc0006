"""Device-resident training input: an in-memory train split lives on every replica's device once, and each step
gathers its batch there by index inside the compiled loop (no per-step iterator hand-off from the host).

The batches are those of data/pipeline.py's host stream for the same seed: epoch e is `epoch_order(seed, e)`,
step s of the epoch takes rows [s * G, (s + 1) * G) of it (G = global batch), replica r takes its contiguous
share (as tf.distribute splits a global batch), and random flips and mixup/cutmix use the same draws, partners and
shares keyed on the step (a replica gathers only its rows and their partners). So resume is exact at any step (the
batch is a function of the step counter), and 1 or N replicas see the same examples; under multi_worker_mirrored
worker w takes the permutation's shard w::W as its host pipeline does. Each call computes its steps' rows once and
gathers the images of up to BLOCK_MAX_BYTES of steps per replica at once. Parameter servers keep the host
pipeline (a log line says so)."""

import dataclasses

import numpy as np
import tensorflow as tf

from data import mixing
from data import pipeline

CHOICES = ("auto", "on", "off")
# A call gathers the images of up to this many bytes of steps per replica at once (digits: all 50 steps of a call in
# 0.8 MB; resnet50_mirrored, 256 per replica at 128 px: 3 steps; at 224 px: 1): one gather instead of one per step.
BLOCK_MAX_BYTES = 160 * 2**20


@dataclasses.dataclass(frozen=True)
class Residency:
  resident: bool
  reason: str  # why (not)
  bytes_per_device: int  # the train split's images + labels (0 when streamed)


def decide(source, data_settings, *, synchronous):
  """Whether this run's train split lives on the devices (data.device_resident, data.device_resident_max_bytes)."""
  mode = data_settings.device_resident
  if mode == "off":
    return Residency(False, "data.device_resident=off", 0)
  if source.input_fn is not None:
    return Residency(False, f"dataset '{source.name}' is a user's input function (its own tf.data pipeline)", 0)
  if source.image_shape is None:
    return Residency(False, f"dataset '{source.name}' is a user's arrays (device residency is for images)", 0)
  if source.train_arrays is None:
    return Residency(False, f"dataset '{source.name}' is streamed (not held in memory)", 0)
  if data_settings.service:
    return Residency(False, f"data.service={data_settings.service} sends the train input through the tf.data service",
                     0)
  size = resident_bytes(source, data_settings.image_size)
  budget = int(data_settings.device_resident_max_bytes)
  blockers = [(size > budget, f"the train split ({size / 2**20:.1f} MiB) is larger than "
                              f"data.device_resident_max_bytes ({budget / 2**20:.1f} MiB)"),
              (not synchronous, "parameter-server workers read their own datasets")]
  for blocked, reason in blockers:
    if blocked:
      return Residency(False, reason, 0)
  return Residency(True, f"the train split ({size / 2**20:.1f} MiB) fits data.device_resident_max_bytes", size)


def resident_bytes(source, image_size):
  """Bytes per device: the split preprocessed once (float32 images after resize and normalisation) + labels."""
  return len(source.train_arrays[1]) * row_bytes(source, image_size) + np.asarray(source.train_arrays[1]).nbytes


def row_bytes(source, image_size, mixed=False):
  """Bytes a replica gathers per example: its float32 image at data.image_size, twice with mixup/cutmix (the
  example's partner too)."""
  return int(np.prod(pipeline.output_shape(source, image_size))) * 4 * (2 if mixed else 1)


def block_steps(bytes_per_row, per_replica_batch):
  """Steps whose images a replica gathers at once (their rows, and their mix partners with mixup/cutmix)."""
  return max(1, BLOCK_MAX_BYTES // (per_replica_batch * bytes_per_row))


def block_bytes(bytes_per_row, per_replica_batch, steps_per_loop):
  """Bytes per device of the largest block a call gathers (beside the resident split)."""
  return min(steps_per_loop, block_steps(bytes_per_row, per_replica_batch)) * per_replica_batch * bytes_per_row


class ResidentTrainData:
  """The train split on every replica's device (a mirrored, non-trainable variable) and the per-step gather.

  A step's batch is read in "groups": the rows the host pipeline augments together under one key. One worker:
  one group, the global batch (key = step), replica l taking rows [l B, (l + 1) B). W workers of L local replicas
  each: L groups of W B rows (key = step L + l), replica l of worker w taking rows w, w + W, ... of group l (the
  host pipeline's shard w::W handed in batches of B to its local replicas is exactly this).
  """

  def __init__(self, strategy, source, data_settings, *, global_batch_size, steps_per_epoch, seed, num_workers=1,
               worker_index=0):
    self.flips = data_settings.random_flip
    self.mix_pairs = mixing.make_pair_mix(source.num_classes, data_settings.mixup_alpha, data_settings.cutmix_alpha,
                                          seed)
    self.per_replica = global_batch_size // strategy.num_replicas_in_sync
    gathered = row_bytes(source, data_settings.image_size, mixed=self.mix_pairs is not None)
    self.steps_per_block = block_steps(gathered, self.per_replica)
    images, labels = source.train_arrays
    # Scaled, resized and normalised once (not per step); only the flips and mixes, keyed per step, remain.
    images = pipeline.make_preprocess(source, data_settings, training=False)(images, labels, 0)[0]
    with strategy.scope():
      self.images = tf.Variable(images, trainable=False, name="resident_images")
      self.labels = tf.Variable(labels, trainable=False, name="resident_labels")
    self.size, self.seed = len(labels), seed
    self.steps_per_epoch = steps_per_epoch
    self.workers, self.worker = num_workers, worker_index
    self.local_replicas = strategy.num_replicas_in_sync // num_workers
    self.groups = 1 if num_workers == 1 else self.local_replicas
    self.group_size = global_batch_size if num_workers == 1 else self.per_replica * num_workers

  @tf.autograph.experimental.do_not_convert
  def call_indices(self, first_step, num_steps):
    """Cross-replica context: [num_steps, groups, group size] rows of the steps of one call (computed once per
    call: each epoch's permutation the call touches, then one gather). Group g of step j of an epoch is
    positions [(j G + g) S, (j G + g + 1) S) of the epoch's permutation (G groups of S rows per step)."""
    steps = tf.cast(first_step, tf.int64) + tf.range(tf.cast(num_steps, tf.int64))
    epochs, within = steps // self.steps_per_epoch, steps % self.steps_per_epoch
    first_epoch = epochs[0]
    orders = tf.map_fn(lambda epoch: pipeline.epoch_order(self.seed, epoch, self.size),
                       tf.range(first_epoch, epochs[-1] + 1), fn_output_signature=tf.int64)
    groups = within[:, tf.newaxis] * self.groups + tf.range(self.groups, dtype=tf.int64)[tf.newaxis, :]
    columns = groups[:, :, tf.newaxis] * self.group_size + tf.range(self.group_size, dtype=tf.int64)
    return tf.gather(tf.gather(orders, epochs - first_epoch), columns, batch_dims=1)

  @tf.autograph.experimental.do_not_convert
  def replica_block(self, rows, first_step):
    """Replica context: this replica's share of the c consecutive steps from `first_step` whose groups are `rows`
    [c, groups, group size]: its images [c, B, ...] (flipped) and labels gathered at once; with mixup/cutmix also
    its rows' partners and each step's key (the mix itself is per step, in step_batch)."""
    local = self._local_replica()
    group = rows[:, local if self.workers > 1 else 0]  # [c, group size]
    positions = (tf.range(self.per_replica, dtype=tf.int64) * self.workers + self.worker if self.workers > 1 else
                 local * self.per_replica + tf.range(self.per_replica, dtype=tf.int64))
    steps = tf.shape(group)[0]
    keys = tf.cast(first_step, tf.int64) + tf.range(tf.cast(steps, tf.int64))
    if self.workers > 1:
      keys = keys * self.local_replicas + local
    draws = (tf.map_fn(lambda key: pipeline.flip_draws(self.seed, key, self.group_size), keys,
                       fn_output_signature=tf.float32) if self.flips else None)  # [c, group size]
    block = self._rows_at(group, draws, tf.broadcast_to(positions, [steps, self.per_replica]))
    if self.mix_pairs is None:
      return block
    partners = tf.map_fn(lambda key: mixing.partners(self.seed, key, self.group_size), keys,
                         fn_output_signature=tf.int32)
    return block + self._rows_at(group, draws, tf.gather(partners, positions, axis=1)) + (keys,)

  @tf.autograph.experimental.do_not_convert
  def step_batch(self, block, i):
    """Replica context: step i's (images, labels) of a block from replica_block (one gather per part: fewer ops
    per step than slicing by a tensor index)."""
    parts = [tf.gather(part, i) for part in block]
    return tuple(parts) if self.mix_pairs is None else self.mix_pairs(*parts)

  @tf.autograph.experimental.do_not_convert
  def _rows_at(self, group, draws, positions):
    """(images, labels) of the rows at `positions` [c, n] of each step's group, flipped by the group's draws."""
    examples = tf.gather(group, positions, batch_dims=1)
    images, labels = tf.gather(self.images, examples), tf.gather(self.labels, examples)
    if draws is not None:
      images = pipeline.flip_rows(images, tf.gather(draws, positions, batch_dims=1))
    return images, labels

  @tf.autograph.experimental.do_not_convert
  def _local_replica(self):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.cast(replica - self.worker * self.local_replicas, tf.int64)
