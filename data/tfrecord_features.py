"""TFRecord files of any named features, for a task: `data.name=tfrecord` with `data.tfrecord.features` set.

  --config.data.tfrecord.features="('tokens:int64:128', 'mask:float32:128', 'tags:float32:5')"
  --config.data.tfrecord.targets="('tags',)"   --config.data.data_dir='/data/set/{split}-*.tfrecord'

Each entry is `name:dtype:shape` (shape `128`, `8x8x1`, or empty for a scalar) of a fixed-length
tf.train.Example feature; the named `targets` are the targets, the others the features (one name: that tensor,
several: a dict). The files of split S match data_dir with {split}=S, read in sorted order; their records are
counted once at load. It is an input function (data/user_stream.py) underneath: the train split's files permuted
and its records permuted within runs of data.shuffle_window, keyed on (seed, epoch) with stateless ops, sharded
across input pipelines before batching, so resume is exact and any replica or worker count sees the same global
batches.
"""

import re

import tensorflow as tf

from data import tfrecord
from data import user_stream
from errors import ConfigError

_SPEC = re.compile(r"^(\w+):(\w+):((?:\d+(?:x\d+)*)?)$")


def parse_spec(entries):
  """{name: tf.io.FixedLenFeature} of `name:dtype:shape` entries (ConfigError naming a bad one)."""
  spec = {}
  for entry in entries:
    match = _SPEC.match(str(entry))
    dtype = match and getattr(tf, match.group(2), None)
    if not match or dtype not in (tf.int64, tf.float32, tf.string):
      raise ConfigError(f"data.tfrecord.features entry {entry!r} must be 'name:dtype:shape' with dtype int64, "
                        f"float32 or string and shape like 128 or 8x8x1 (empty for a scalar)")
    shape = [int(d) for d in match.group(3).split("x")] if match.group(3) else []
    spec[match.group(1)] = tf.io.FixedLenFeature(shape, dtype)
  return spec


def source(data_config):
  """The Source of feature-spec TFRecord files (see the module doc)."""
  settings = data_config.tfrecord
  spec, targets = parse_spec(settings.features), tuple(settings.targets)
  features = tuple(name for name in spec if name not in targets)
  if not targets or not features or set(targets) - set(spec):
    raise ConfigError(f"data.tfrecord.targets={targets} must name some (not all) of data.tfrecord.features "
                      f"({', '.join(spec)})")
  if "{split}" not in data_config.data_dir:
    raise ConfigError(f"data.tfrecord.features reads a glob of TFRecord files with {{split}} for the split name "
                      f"(e.g. /data/set/{{split}}-*.tfrecord), got data.data_dir={data_config.data_dir}")
  files = {split: tfrecord.split_files(data_config.data_dir, name, None) for split, name in
           (("train", data_config.train_split), ("eval", data_config.eval_split))}
  for paths, _ in files.values():
    check_first_record(paths, spec)
  pick = lambda parsed, names: parsed[names[0]] if len(names) == 1 else {n: parsed[n] for n in names}

  def batches(split, *, batch_size, context, seed, epoch):
    paths, counts = files[split]
    if split == "eval":
      ds = tf.data.TFRecordDataset(list(paths))
    else:
      ds = _keyed_shuffle(paths, data_config.shuffle_window, seed, epoch)
      ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
    ds = ds.apply(tf.data.experimental.assert_cardinality(sum(counts) if split == "eval" else
                                                          _share(sum(counts), context)))
    ds = ds.batch(batch_size, drop_remainder=split == "train")
    return ds.map(lambda records: _parsed(records, spec, features, targets, pick))

  return user_stream.load(f"tfrecord:{data_config.data_dir}", batches)


KINDS = {tf.int64: ("int64_list", "int64"), tf.float32: ("float_list", "float32"), tf.string: ("bytes_list", "string")}


def check_first_record(paths, spec):
  """ConfigError when the first record of `paths` lacks a feature of `spec` or holds it with another dtype or
  number of values (tf.io.parse_example would fail at the first train call, inside a traceback)."""
  first = next(iter(tf.data.TFRecordDataset(list(paths)[:1]).take(1)), None)
  if first is None:
    return
  held = tf.train.Example.FromString(first.numpy()).features.feature
  for name, feature in spec.items():
    wanted = f"{name}:{KINDS[feature.dtype][1]}:{'x'.join(map(str, feature.shape))}"
    if name not in held:
      raise ConfigError(f"data.tfrecord.features entry '{wanted}': the records of {paths[0]} have no feature "
                        f"'{name}' (they have: {', '.join(sorted(held))})")
    kind = held[name].WhichOneof("kind")
    count = len(getattr(held[name], kind).value) if kind else 0
    size = int(tf.TensorShape(feature.shape).num_elements())
    if kind != KINDS[feature.dtype][0] or count != size:
      dtype = next((d for k, d in KINDS.values() if k == kind), "empty")
      raise ConfigError(f"data.tfrecord.features entry '{wanted}': the records of {paths[0]} hold '{name}' as {count} "
                        f"{dtype} values, not {size} {KINDS[feature.dtype][1]}; e.g. '{name}:{dtype}:{count}' reads them")


def _keyed_shuffle(paths, window, seed, epoch):
  """The records of `paths` in an order keyed on (seed, epoch) with stateless ops: the files permuted, then the
  records within each run of `window` (tf.data's shuffle buffer takes no seed tensor in a graph with a global seed)."""
  files = tf.gather(tf.constant(list(paths)), _permutation(len(paths), seed, epoch, 0))
  blocks = tf.data.TFRecordDataset(files).batch(window).enumerate(start=1)
  return blocks.map(lambda i, block: tf.gather(block, _permutation(tf.shape(block)[0], seed, epoch, i))).unbatch()


def _permutation(size, seed, epoch, salt):
  key = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64) * (1 << 32) + tf.cast(salt, tf.int64)])
  return tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int64), seed=key)


def _share(count, context):
  """Records pipeline `context.input_pipeline_id` keeps of `count` (shard: every n-th from its index)."""
  n, i = context.num_input_pipelines, context.input_pipeline_id
  return (count - i + n - 1) // n


def _parsed(records, spec, features, targets, pick):
  parsed = tf.io.parse_example(records, spec)
  return pick(parsed, features), pick(parsed, targets)
