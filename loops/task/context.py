"""StepContext: what a task's step needs to be correct under distribution, one helper per classic mistake.

A task's train and eval steps run once per replica, on that replica's share of the global batch. Every helper
here exists because the obvious code is silently wrong on more than one replica (loops/replica_check.py, i.e.
`main.py --check=replicas`, catches it when a step does the obvious thing instead).
"""

from absl import logging
import tensorflow as tf

from errors import ConfigError


@tf.autograph.experimental.do_not_convert
def _gathered_rows_of_any_count(replica, value):
  """all_gather of rows whose count may differ per replica (e.g. tf.boolean_mask's): each replica's rows padded to
  the largest count, gathered with the counts, the padding dropped (a collective needs one shape everywhere)."""
  rows = tf.shape(value)[0]
  counts = replica.all_gather(tf.reshape(rows, [1]), axis=0)  # (ReduceOp has no MAX)
  most = tf.reduce_max(counts)
  padding = tf.concat([[[0, most - rows]], tf.zeros([tf.rank(value) - 1, 2], tf.int32)], axis=0)
  gathered = replica.all_gather(tf.pad(value, padding), axis=0)
  return tf.boolean_mask(gathered, tf.reshape(tf.sequence_mask(counts, most), [-1]))


class StepContext:
  """Passed to Task.per_example_loss / train_step / eval_step; valid inside the replica function only."""

  def __init__(self, global_batch_size, step, training, declared=(), metrics=None, weights=None,
               input_pipelines=1, micro_batch=(0, 1), updating=None, streams=None):
    self.global_batch_size = global_batch_size
    self._streams = dict(streams or {})  # Task.streams: {name: k}, stream name's global batch k x the run's
    self.input_pipelines = input_pipelines  # one per worker under multi_worker_mirrored (the plan's)
    self.micro_batch = micro_batch  # (index, count) of train.grad_accum_steps' split of the replica's batch
    self.training = training
    self._step = step
    self._declared = tuple(declared)
    self._logged = {}
    self.metrics = metrics or {}  # eval: the task's Keras metrics (Task.build_metrics), by name
    self.weights = weights  # eval: per-example weights of this batch (0 = padding rows), else None
    self._updating = updating  # {trained model name: updates in this variant of the step} (Task.update_every)

  @property
  def step(self):
    """The global step before this update (int64), the same on every replica and worker. Each read orders the
    step against the counter's update: read it only where it is used."""
    return tf.convert_to_tensor(self._step)

  @tf.autograph.experimental.do_not_convert
  def updates(self, name):
    """Whether the model `name`'s optimizer applies in this step: a PYTHON bool, fixed when the step is traced
    (Task.update_every: the step is traced once per combination, each step runs its own). Branch the update on it:
    `if ctx.updates("model"): ...` (always True for a model not in update_every, and outside the train step).

    Mistake prevented: `tf.cond(step % k == k - 1, update, no_op)` applies an optimizer inside control flow, which
    trains on one replica and cannot compile on several (its all-reduce is a merge_call).
    """
    if self._updating is None:
      return True
    if name not in self._updating:
      raise ConfigError(f"ctx.updates('{name}'): '{name}' is not a trained model of the task (trained: "
                        f"{sorted(self._updating)})")
    return self._updating[name]

  @property
  def replica_id(self):
    """This replica's index in [0, num_replicas): for per-replica randomness, never for arithmetic."""
    replica = tf.distribute.get_replica_context()
    return replica.replica_id_in_sync_group if replica else 0

  @property
  def num_replicas(self):
    """Replicas in sync (1 outside a replica function: the framework's zero-batch probe of eval_step)."""
    replica = tf.distribute.get_replica_context()
    return replica.num_replicas_in_sync if replica else 1

  @tf.autograph.experimental.do_not_convert
  def average(self, per_example, stream=None):
    """This replica's share of the mean over the GLOBAL batch: sum(per_example) / global_batch_size (of the named
    stream's global batch, for a task with Task.streams).

    Mistake prevented: `tf.reduce_mean(per_example)` divides by the LOCAL batch; the optimizer then sums the
    replicas' gradients and the update is num_replicas times too large.
    """
    return tf.nn.compute_average_loss(tf.cast(per_example, tf.float32),
                                      global_batch_size=self.stream_batch_size(stream))

  @tf.autograph.experimental.do_not_convert
  def stream_batch_size(self, stream=None):
    """The global batch of Task.streams' `stream` (k x the run's), or the run's for None."""
    if stream is None:
      return self.global_batch_size
    if stream not in self._streams:
      raise ConfigError(f"stream '{stream}' is not one of the task's streams {list(self._streams)}")
    return self.global_batch_size * self._streams[stream]

  @tf.autograph.experimental.do_not_convert
  def regularization(self, model):
    """The model's regularisation losses (kernel_regularizer, ...) as this replica's share.

    Mistake prevented: adding `sum(model.losses)` on every replica counts it num_replicas times.
    """
    if not model.losses:
      return tf.constant(0.0)
    return tf.nn.scale_regularization_loss(tf.add_n([tf.cast(l, tf.float32) for l in model.losses]))

  @tf.autograph.experimental.do_not_convert
  def all_gather(self, value):
    """Every replica's rows of `value` concatenated on axis 0, in replica order (global batch order on one
    worker); gradients flow back to each replica's own rows.

    Mistake prevented: contrastive negatives, batch statistics or a global top-k taken from the replica's own
    rows only: the loss then depends on how the global batch is split. Under train.grad_accum_steps = k it gathers
    each micro-batch (1/k of the global batch): said once, when the step is traced.
    """
    index, count = self.micro_batch
    if count > 1 and index == 0:
      logging.warning("ctx.all_gather under train.grad_accum_steps=%d gathers each micro-batch: a loss over the "
                      "gathered rows (contrastive negatives) sees 1/%d of the global batch at a time", count, count)
    replica = tf.distribute.get_replica_context()
    if replica is None or replica.num_replicas_in_sync == 1:
      return value
    if value.shape.rank and value.shape[0] is not None:
      return replica.all_gather(value, axis=0)
    return _gathered_rows_of_any_count(replica, value)

  @tf.autograph.experimental.do_not_convert
  def global_rows(self, rows):
    """Where this replica's `rows` examples sit in all_gather's result (and in the global batch of one worker):
    replica_id * rows + [0, rows). The positives of a contrastive loss over gathered rows."""
    return tf.cast(self.replica_id, tf.int32) * rows + tf.range(rows)

  @tf.autograph.experimental.do_not_convert
  def sum_over_replicas(self, value):
    """The sum of `value` over all replicas (a collective): e.g. a global count to normalise by."""
    replica = tf.distribute.get_replica_context()
    return replica.all_reduce(tf.distribute.ReduceOp.SUM, value) if replica else value

  @tf.autograph.experimental.do_not_convert
  def normal(self, rows, shape=(), salt=0):
    """Standard normal draws for this replica's `rows` examples, keyed on (step, salt) and on each example's row
    of the global batch as one device reads it: an example gets the same draw however the global batch is split
    over replicas and workers.

    Mistake prevented: noise keyed on the replica (or a stateful generator per replica) makes 2 replicas train
    on other draws than 1 does. Exact pairing under several workers holds for inputs sharded by example (arrays,
    npz, TFRecord features, the eval split, an input function using ds.shard(context...)); streamed image records
    (data.train_files) give each worker whole blocks: the same draws, paired with other examples.
    """
    seed = tf.stack([tf.cast(self.step, tf.int64), tf.cast(salt, tf.int64)])
    return self.keyed_draws(tf.random.stateless_normal, [rows, *shape], seed)

  def keyed_draws(self, draw, shape, seed):
    """draw(shape, seed) (a tf.random.stateless_* function) for this replica's shape[0] rows, each row's values
    those one device draws for it: the draw covers every replica's rows (shape[0] x replicas x micro-batches, the
    global batch for a replica's own rows) and this replica keeps its own. ctx.normal and the keyed random layers
    (loops/modeling/random_layers.py) draw through it."""
    shape = tf.cast(tf.stack(shape) if isinstance(shape, (list, tuple)) else shape, tf.int32)
    rows = shape[0]
    every_row = rows * self.micro_batch[1] * self.num_replicas
    draws = draw(tf.concat([[every_row], shape[1:]], 0), seed=seed)
    return tf.gather(draws, self._rows_as_one_device_reads(rows))

  def _batch_rows(self):
    """The rows this replica's batch of the run and of each of Task.streams holds (of this micro-batch): the
    tensors whose rows _rows_as_one_device_reads places."""
    shares = self.num_replicas * self.micro_batch[1]
    return {self.global_batch_size * k // shares for k in [1, *self._streams.values()]}

  @tf.autograph.experimental.do_not_convert
  def _rows_as_one_device_reads(self, rows):
    """Where this replica's rows sit in the global batch of one device. Several workers read strided shards of
    it (worker w: rows w, w + W, ...), each local replica takes the next batch of its worker's shard, and gradient
    accumulation's micro-batch i takes rows i, i + k, ... of the replica's batch."""
    replica, pipelines = tf.cast(self.replica_id, tf.int32), self.input_pipelines
    local_replicas = self.num_replicas // pipelines
    worker, local = replica // local_replicas, replica % local_replicas
    index, count = self.micro_batch
    return ((local * rows + tf.range(rows)) * count + index) * pipelines + worker

  @tf.autograph.experimental.do_not_convert
  def log(self, name, value):
    """Adds `value` (a scalar, or per-example values) to train/<name>: its mean over the call's steps, every
    replica and worker, reported with train/loss.

    Mistake prevented: a per-scalar collective (Lightning's `sync_dist=True`) each step; these sums ride in
    the call's one read-out all-reduce. Names must be declared in Task.train_metrics. Ignored in eval.
    """
    if not self.training:
      return
    if name not in self._declared:
      raise ValueError(f"ctx.log('{name}', ...): declare it in the task's train_metrics "
                       f"(declared: {list(self._declared)})")
    value = tf.reshape(tf.cast(value, tf.float32), [-1])
    total, count = self._logged.get(name, (0.0, 0.0))
    self._logged[name] = (total + tf.reduce_sum(value), count + tf.cast(tf.size(value), tf.float32))

  @tf.autograph.experimental.do_not_convert
  def logged(self):
    """{name: (sum, count)} of this step's log() calls."""
    return dict(self._logged)
