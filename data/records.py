"""Streamed train records: a split kept as files of TFRecords, read in an order that is a pure function of
(seed, epoch), each input pipeline opening only its own files and decoding only its own examples.

The rule (see docs/data.md, "Data that does not fit in memory"):
- The split's files are dealt once into `data.streams` streams (V), balanced by record count: the largest file
  first, each to the stream with the fewest records so far (ties: the lower stream). Under W workers (W divides
  V) worker w reads streams w, w + W, ...; a single pipeline reads all of them.
- Each step takes B / V records from every stream (B = the global batch): the global batch is stream 0's records,
  then stream 1's, ... An epoch has `min over streams of (records // (B / V))` steps; a stream's records beyond
  that are left out of that epoch (different ones every epoch).
- Epoch e of stream v reads the stream's files in an order keyed on (seed, e, v) and permutes its records in
  windows of `data.shuffle_window` raw records, each window keyed on (seed, e, v, window).
- Resume at step S: epoch S // steps, position r = (S % steps) * B / V in every stream: whole files are skipped
  by their counts, records inside a file by TFRecord's header seek, the partial window is re-read raw (at most
  window - 1 records); nothing skipped is parsed or decoded.
"""

import dataclasses

import numpy as np
import tensorflow as tf

MAX_EPOCHS = 1 << 40


@dataclasses.dataclass(frozen=True)
class RecordFiles:
  """A split stored as TFRecord files.

  paths: the files, in a fixed order; counts: records in each; parse: fn(serialized) -> (record, label) where
  `record` is what the source's decode turns into an image (e.g. encoded bytes), cheap to compute.
  """
  paths: tuple
  counts: tuple
  parse: object

  @property
  def size(self):
    return int(sum(self.counts))


def assign_streams(counts, streams):
  """[[file index, ...] per stream]: files dealt largest first, each to the stream with the fewest records so far
  (ties: the lower stream); within a stream, by file index."""
  totals = [0] * streams
  dealt = [[] for _ in range(streams)]
  for index in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
    v = min(range(streams), key=lambda s: (totals[s], s))
    dealt[v].append(index)
    totals[v] += counts[index]
  return [sorted(files) for files in dealt]


def stream_sizes(files, streams):
  return [sum(files.counts[i] for i in dealt) for dealt in assign_streams(files.counts, streams)]


def steps_per_epoch(files, streams, global_batch):
  """Steps an epoch has: the smallest stream's records over its share of a step."""
  return min(stream_sizes(files, streams)) // (global_batch // streams)


def _key(seed, *values):
  key = tf.stack([tf.cast(seed, tf.int64), tf.constant(0, tf.int64)])
  for value in values:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(value, tf.int64))
  return key


@tf.autograph.experimental.do_not_convert
def epoch_records(files, stream, streams, seed, per_epoch, window, epoch, position):
  """Stream `stream`'s raw records of `epoch` from `position` (a tensor): files in a keyed order, skipped whole by
  their counts, records by TFRecord's header seek, the partial window re-read raw, then keyed windows."""
  dealt = assign_streams(files.counts, streams)[stream]
  paths = tf.constant([files.paths[i] for i in dealt])
  counts = tf.constant([files.counts[i] for i in dealt], tf.int64)
  position = tf.cast(position, tf.int64)
  order = tf.random.experimental.stateless_shuffle(tf.range(len(dealt), dtype=tf.int64),
                                                   seed=_key(seed, epoch, stream))
  window_start = position // window * window
  ends = tf.cumsum(tf.gather(counts, order))
  first = tf.searchsorted(ends, tf.reshape(window_start, [1]), side="right")[0]
  inside = window_start - tf.where(first > 0, tf.gather(ends, tf.maximum(first - 1, 0)), 0)
  remaining = tf.gather(paths, order[first:])
  raw = _read(remaining[:1]).skip(inside).concatenate(_read(remaining[1:]))
  windows = tf.data.Dataset.zip(tf.data.Dataset.range(window_start // window, MAX_EPOCHS), raw.batch(window))
  shuffled = windows.map(lambda i, batch: tf.gather(batch, tf.random.experimental.stateless_shuffle(
      tf.range(tf.shape(batch)[0]), seed=_key(seed, epoch, stream, i))))
  return shuffled.unbatch().skip(position - window_start).take(per_epoch - position)


def _read(paths):
  """The raw records of `paths` in order (AUDIT, when set, sees each file name and record: tests and benchmarks
  count what an input pipeline reads)."""
  ds = tf.data.Dataset.from_tensor_slices(paths)
  if AUDIT is None:
    return ds.flat_map(tf.data.TFRecordDataset)
  return ds.flat_map(lambda path: tf.data.TFRecordDataset(path).map(lambda record: AUDIT(path, record)))


AUDIT = None  # fn(path, raw record) -> raw record


def pipeline_streams(streams, num_pipelines, pipeline_index):
  """The streams input pipeline `pipeline_index` of `num_pipelines` reads: index, index + n, ..."""
  return list(range(pipeline_index, streams, num_pipelines))


def batches(files, *, streams, global_batch, seed, window, start_step=0, num_pipelines=1, pipeline_index=0,
            decode=None):
  """Unbounded (images, labels, rows, step) batches of this pipeline's share of every step, from `start_step`:
  B / V records of each of its streams, in stream order, parsed and then decoded (`decode`, when given); `rows`
  are their places in the global batch and `step` the global step (they key augmentation alike however the batch
  is split). One source, range(epochs), each epoch built whole from it: a tf.data service with dynamic sharding
  hands out epochs."""
  share = global_batch // streams
  steps = steps_per_epoch(files, streams, global_batch)
  start_epoch, start_in_epoch = divmod(int(start_step), steps)
  mine = pipeline_streams(streams, num_pipelines, pipeline_index)
  rows = tf.constant(np.concatenate([np.arange(v * share, (v + 1) * share) for v in mine]), tf.int64)
  parse = files.parse if decode is None else lambda serialized: _decoded(files.parse(serialized), decode)

  @tf.autograph.experimental.do_not_convert  # framework code: converted, a pipeline's start took ~0.6 s more CPU
  def one_epoch(epoch):
    first = tf.where(epoch == start_epoch, tf.constant(start_in_epoch, tf.int64), 0)
    parts = [epoch_records(files, v, streams, seed, steps * share, window, epoch, first * share).batch(share)
             for v in mine]
    ds = tf.data.Dataset.zip(tuple(parts)).map(lambda *b: tf.concat(b, 0)).unbatch()
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(share * len(mine))
    return ds.enumerate(start=epoch * steps + first).map(lambda step, batch: (batch[0], batch[1], rows, step))

  return tf.data.Dataset.range(start_epoch, MAX_EPOCHS).flat_map(one_epoch)


def _decoded(parsed, decode):
  record, label = parsed
  return decode(record), label
