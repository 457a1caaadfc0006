"""Input pipelines: a keyed per-epoch order -> shard -> skip -> decode -> batch -> preprocess -> prefetch.

The train stream is a pure function of (seed, start_step): in-memory data takes a permutation of epoch e keyed on
(seed, e) (record files: data/records.py's streams, keyed alike), and random flips (one draw per row of the global
batch) and mixup/cutmix are keyed on (seed, step), so a resumed run sees exactly the batches an uninterrupted run
would have seen, and an example is augmented alike however the global batch is split. The order is fixed before
sharding, with the same seed on every input pipeline, so the shards of one epoch are disjoint and cover it; what
needs decoding is decoded after shard and skip, by the pipeline that keeps it.
"""

import math

import tensorflow as tf

from data import mixing
from data import records
from data import user_stream

_MAX_EPOCHS = 1 << 40  # the train stream is unbounded; the loop decides when to stop.
# tf.data converts a map function with AutoGraph; the pipeline's own lambdas branch on no tensor and call no user
# code, and parsing a lambda's source for it cost 20-150 ms each at every run's start.
_plain = tf.autograph.experimental.do_not_convert


def output_shape(source, image_size):
  """Image shape after preprocessing to data.image_size (a user's arrays: their features' shape, or None for a
  nest)."""
  if source.image_shape is None:
    features = source.train.element_spec[0]
    return tuple(features.shape) if isinstance(features, tf.TensorSpec) else None
  height, width, channels = source.image_shape
  if image_size:
    height = width = int(image_size)
  return (height, width, channels)


def make_preprocess(source, data_settings, *, training, seed=0, num_shards=1, shard_index=0, global_rows=None):
  """Returns fn(images, labels, key, rows=None) -> (float32 images, labels) for a BATCH (vectorised).

  `key` (the global step of the batch) seeds its random flips: one draw per row of the GLOBAL batch, of which this
  shard's rows are shard_index, shard_index + num_shards, ... (or `rows`, their places among `global_rows`) — so
  an example is flipped alike however the global batch is split over workers.
  """
  if source.image_shape is None:  # a user's arrays (data/user_source.py): fed as they are
    return _plain(lambda features, targets, key, rows=None: (features, targets))
  mean, std = data_settings.mean, data_settings.std
  flip = training and data_settings.random_flip
  size = data_settings.image_size

  @tf.autograph.experimental.do_not_convert
  def preprocess(images, labels, key, rows=None):
    images = tf.cast(images, tf.float32) / source.max_value
    if size and tuple(source.image_shape[:2]) != (size, size):
      images = tf.image.resize(images, (size, size))
    if flip and rows is not None:
      images = flip_rows(images, tf.gather(flip_draws(seed, key, global_rows), rows))
    elif flip:
      images = flip_rows(images, flip_draws(seed, key, tf.shape(images)[0] * num_shards)[shard_index::num_shards])
    if mean is not None:
      images = (images - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)
    return images, labels

  return preprocess


def eval_images(source, data_settings):
  """fn(raw image batch) -> the images as the eval sees them (make_preprocess, training=False): eval_dataset and
  the serving export run it."""
  preprocess = make_preprocess(source, data_settings, training=False)
  return _plain(lambda images: preprocess(images, None, 0)[0])


def raw_image_spec(source):
  """tf.TensorSpec of a batch of the source's images before preprocessing: [None, H, W, C], their dtype (a user's
  arrays or input function: its features as they come)."""
  features = source.eval.element_spec[0]
  if source.image_shape is None:
    return tf.TensorSpec((None,) + tuple(features.shape), features.dtype)
  dtype = tf.uint8 if source.decode is not None else features.dtype
  return tf.TensorSpec((None,) + tuple(source.image_shape), dtype)


@tf.autograph.experimental.do_not_convert
def epoch_order(seed, epoch, size):
  """The permutation of the train split's `size` examples for `epoch` (every pipeline and replica computes it
  alike, so shards of it are disjoint)."""
  seed = tf.cast(seed, tf.int64)
  return tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int64),
                                                  seed=tf.stack([seed, tf.cast(epoch, tf.int64)]))


@tf.autograph.experimental.do_not_convert
def flip_rows(images, draws):
  """Reverses (left-right) the rows whose draw is < 0.5. Commutes with per-pixel scaling and normalisation."""
  flipped = tf.where(draws < 0.5)  # only these rows are reversed (measured 3x cheaper than a broadcast select)
  return tf.tensor_scatter_nd_update(images, flipped, tf.reverse(tf.gather_nd(images, flipped), axis=[2]))


@tf.autograph.experimental.do_not_convert
def flip_draws(seed, key, rows):
  """One uniform draw per row of a global batch of `rows`, keyed on (seed, key); a row is flipped when < 0.5."""
  return tf.random.stateless_uniform([rows], seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(key, tf.int64)]))


def steps_per_epoch(source, data_settings, global_batch):
  """Steps an epoch of the train split has at this global batch (record files: data/records.py's streams)."""
  if source.train_files is not None:
    return records.steps_per_epoch(source.train_files, data_settings.streams, global_batch)
  return source.train_size // global_batch


def train_dataset(source, data_settings, *, batch_size, steps_per_epoch, seed, start_step=0,
                  num_shards=1, shard_index=0, local_replicas=1, decorrelate=False):
  """Unbounded stream of (images, labels) batches of `batch_size`, from global step `start_step`.

  This pipeline is shard `shard_index` of `num_shards` (one per worker) and feeds `local_replicas` replicas, one
  batch each per step: the global batch is batch_size x num_shards x local_replicas. The order is a pure
  function of (seed, epoch): in-memory data (images, or records such as file paths decoded after sharding) takes
  a per-epoch permutation keyed on (seed, epoch), shard i of n its rows i, i+n, ...; record files are read as
  data/records.py's streams, shard i its own streams. So resume is exact and any replica or worker count sees the
  same examples per step. decorrelate=True mixes the clock into each epoch's permutation (in-memory data), for
  asynchronous workers that all run this same function (parameter servers); it is not reproducible.
  With mixup/cutmix every in-memory pipeline reads and mixes the whole global batch, then keeps its rows, so the
  mixes do not depend on how the batch is split (record files: one pipeline only; loops/rules.py).
  """
  if source.input_fn is not None:
    batches = user_stream.stream_batches if source.streams else user_stream.train_batches
    return _finish(batches(source, batch_size=batch_size, steps_per_epoch=steps_per_epoch, seed=seed,
                           start_step=start_step, num_shards=num_shards, shard_index=shard_index,
                           local_replicas=local_replicas, decorrelate=decorrelate),
                   data_settings, service_pipeline=shard_index)
  if source.train_files is not None:
    return _finish(_streamed_batches(source, data_settings, batch_size, seed, start_step, num_shards, shard_index,
                                     local_replicas), data_settings, service_pipeline=shard_index)
  steps_per_epoch, start_step = steps_per_epoch * local_replicas, start_step * local_replicas  # a batch per replica
  mix = mixing.make_mix(source.num_classes, data_settings.mixup_alpha, data_settings.cutmix_alpha, seed)
  if mix is None:
    preprocess = make_preprocess(source, data_settings, training=True, seed=seed, num_shards=num_shards,
                                 shard_index=shard_index)
    ds = _batches(source, batch_size, steps_per_epoch, seed, start_step, num_shards, shard_index, decorrelate)
    ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
  else:
    preprocess = make_preprocess(source, data_settings, training=True, seed=seed)
    ds = _batches(source, batch_size * num_shards, steps_per_epoch, seed, start_step, 1, 0, decorrelate)
    ds = ds.map(_plain(lambda images, labels, key: mix(*preprocess(images, labels, key), key)),
                num_parallel_calls=tf.data.AUTOTUNE)
    if num_shards > 1:
      ds = ds.map(_plain(lambda images, labels: (images[shard_index::num_shards], labels[shard_index::num_shards])))
  return _finish(ds, data_settings, service_pipeline=shard_index)


@tf.autograph.experimental.do_not_convert
def decorrelated(seed):
  """The seed with the clock mixed in (asynchronous parameter-server workers: not reproducible)."""
  return tf.constant(seed, tf.int64) + tf.cast(tf.math.floormod(tf.timestamp() * 1e6, 2.0**40), tf.int64)


def _batches(source, batch_size, steps_per_epoch, seed, start_step, num_shards, shard_index, decorrelate):
  """(raw images, labels, key) batches of this shard of in-memory data: the permuted, sharded, resumable stream;
  key is the batch's step (it seeds the batch's random augmentation alike on every shard). In-memory records
  (file paths) are gathered, then each decoded."""
  examples_per_shard = steps_per_epoch * batch_size
  start_epoch, skip_steps = divmod(int(start_step), int(steps_per_epoch))
  held = source.train_arrays if source.train_arrays is not None else source.train_records
  examples, labels = (tf.nest.map_structure(tf.constant, a) for a in held)
  gather = lambda nest, i: tf.nest.map_structure(lambda t: tf.gather(t, i), nest)

  @tf.autograph.experimental.do_not_convert
  def one_epoch(epoch):
    epoch_seed = decorrelated(seed) if decorrelate else tf.constant(seed, tf.int64)
    order = epoch_order(epoch_seed, epoch, source.train_size)
    ds = tf.data.Dataset.from_tensor_slices(order).shard(num_shards, shard_index).take(examples_per_shard)
    first = tf.where(epoch == start_epoch, tf.constant(skip_steps, tf.int64), 0)
    ds = ds.skip(first * batch_size).batch(batch_size, drop_remainder=True)
    return ds.enumerate(start=epoch * steps_per_epoch + first)  # keys made per epoch: any data worker may make it

  # Whole batches of indices, then one gather per batch: no per-example work for data held as images.
  ds = tf.data.Dataset.range(start_epoch, _MAX_EPOCHS).flat_map(one_epoch)
  if source.train_arrays is not None:
    return ds.map(_plain(lambda key, i: (gather(examples, i), gather(labels, i), key)),
                  num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.map(_plain(lambda key, i: (tf.gather(examples, i), tf.gather(labels, i), tf.fill(tf.shape(i), key))))
  ds = ds.unbatch().map(_plain(lambda record, label, key: (source.decode(record), label, key)),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.batch(batch_size, drop_remainder=True).map(_plain(lambda images, labels, keys: (images, labels, keys[0])))


def _streamed_batches(source, data_settings, batch_size, seed, start_step, num_shards, shard_index, local_replicas):
  """Record files: this pipeline's streams' rows of every step (decoded after the streams' order, shard and skip),
  flipped and mixed by their rows' places in the global batch, then one batch per local replica."""
  global_batch = batch_size * num_shards * local_replicas
  ds = records.batches(source.train_files, streams=data_settings.streams, global_batch=global_batch, seed=seed,
                       window=data_settings.shuffle_window, start_step=start_step, num_pipelines=num_shards,
                       pipeline_index=shard_index, decode=source.decode)
  preprocess = make_preprocess(source, data_settings, training=True, seed=seed, global_rows=global_batch)
  mix = (mixing.make_mix(source.num_classes, data_settings.mixup_alpha, data_settings.cutmix_alpha, seed)
         or (lambda images, labels, _: (images, labels)))
  ds = ds.map(_plain(lambda images, labels, rows, step: mix(*preprocess(images, labels, step, rows=rows), step)),
              num_parallel_calls=tf.data.AUTOTUNE)
  return ds.unbatch().batch(batch_size, drop_remainder=True) if local_replicas > 1 else ds


def eval_dataset(source, data_settings, *, batch_size, num_shards=1, shard_index=0, local_replicas=1, start=0,
                 indexed=False):
  """One pass over the eval split as (images, labels, weights) batches of `batch_size`.

  The split is padded with weight-0 examples to a whole number of global batches (batch_size x num_shards x
  local_replicas), so every replica gets full, equally many batches and metrics weighted by `weights` count
  each real example exactly once. start: the examples before it left out (a resumed prediction); indexed: each
  batch also holds each example's place in the split (int64, padding rows past the end), (images, labels,
  weights, index).
  """
  preprocess = eval_images(source, data_settings)  # the serving export's too
  global_batch = batch_size * num_shards * local_replicas
  size = source.eval_size - start
  padded_size = math.ceil(size / global_batch) * global_batch
  variable = user_stream.has_unknown_dims(source.eval.element_spec, batched=False)
  ds = (source.eval.skip(start) if start else source.eval).map(_plain(lambda image, label: (image, label, 1.0)))
  ds = ds.concatenate(_padding(source, variable).repeat(padded_size - size))
  if indexed:
    ds = ds.enumerate(start).map(_plain(lambda index, example: (*example, index)))
  ds = ds.shard(num_shards, shard_index)
  if source.decode is not None:  # each shard decodes its own records; padding records become zero images
    ds = ds.map(_plain(lambda record, label, weight, *index: (_decode_real(source, record, weight), label, weight,
                                                              *index)), num_parallel_calls=tf.data.AUTOTUNE)
  # Sequences of different lengths: each replica's batch padded with zeros to its longest (never a plain batch()).
  ds = ds.padded_batch(batch_size, drop_remainder=True) if variable else ds.batch(batch_size, drop_remainder=True)
  ds = ds.map(_plain(lambda images, *rest: (preprocess(images), *rest)), num_parallel_calls=tf.data.AUTOTUNE)
  return _finish(ds, data_settings)


def _padding(source, variable):
  """The dataset of one eval padding row, weight 0: zeros of the eval split's spec; examples of different lengths
  (no one zero shape fits, and a fully masked zero row gives 0/0 in masked means): the split's first example."""
  if variable:
    return source.eval.take(1).map(_plain(lambda features, targets: (features, targets, 0.0)))
  return tf.data.Dataset.from_tensors(_blank(source) + (0.0,))


def _blank(source):
  """(features, targets) of an eval padding row: zeros of the eval split's spec (records: an empty record)."""
  spec = source.eval.element_spec
  if source.decode is not None:
    return tf.zeros([], spec[0].dtype), tf.zeros(spec[1].shape, spec[1].dtype)
  return tuple(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), part) for part in spec[:2])


@tf.autograph.experimental.do_not_convert
def _decode_real(source, record, weight):
  return tf.cond(weight > 0, lambda: source.decode(record), lambda: tf.zeros(source.image_shape, tf.uint8))


def pipeline_threads(threads):
  """Threads of the input pipeline's private pool for data.pipeline_threads (`threads`); 0 = tf.data's shared
  default pool (all cores).

  data.pipeline_threads None (auto): 1 when the model trains on the CPU, where pipeline threads compete with
  the step's own threads (measured on 2 cores: digits 1.21x faster, real/synthetic 0.81 -> 0.98), else 0.
  """
  if threads is None:
    accelerators = tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    return 0 if accelerators else 1
  return int(threads)


def _finish(ds, data_settings, service_pipeline=None):
  """Options (determinism, no auto-sharding, the pipeline's thread pool), the tf.data service for a train pipeline
  when data.service is set (data/service.py), prefetch."""
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
  threads = pipeline_threads(data_settings.pipeline_threads)
  if threads:
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
  ds = ds.with_options(options)
  if service_pipeline is not None and data_settings.service:
    from data import service  # imported here: `python -m data.service` must not find itself imported by `data`
    ds = service.distribute(ds, data_settings.service, service_pipeline, data_settings.service_timeout_seconds)
  return ds.prefetch(tf.data.AUTOTUNE)
