"""TFRecord sources: splits kept as files of tf.train.Examples, read through tf.io.gfile (local, gs://, ...).

`data.name="tfrecord"` with `data.data_dir` either
- a directory written by `python -m data.prepare` (its manifest.json gives each split's files and record counts,
  the image shape and format, the classes), or
- a glob of shard files with `{split}` standing for the split name (`gs://bucket/imagenet/{split}-*`): records are
  counted once at load (a manifest spares that), `data.tfrecord.num_classes` is needed, the image shape is read off
  the first record (or `data.tfrecord.image_shape`).
Each record holds the image under `data.tfrecord.image_key` (encoded JPEG/PNG bytes, or raw uint8 bytes of a stated
shape) and the int64 class id under `data.tfrecord.label_key`; the defaults (`image`, `label`) are what tfds writes
for image classification, so tfds' own shard files are read the same way (`tfds_files`).

With `data.in_memory=False` the train split streams (data/records.py: each input pipeline opens only its own files
and decodes only its own examples); with True both splits are decoded into memory once.
"""

import hashlib
import json
import posixpath
import re

import numpy as np
import tensorflow as tf

from data import records
from data.loaded_source import Source, from_arrays
from errors import ConfigError, first_line

MANIFEST = "manifest.json"
FORMATS = ("encoded", "raw")


def manifest_path(data_dir):
  return posixpath.join(data_dir, MANIFEST)


def read_manifest(data_dir):
  """The manifest of a prepared directory, or None when `data_dir` is not one."""
  path = manifest_path(data_dir)
  if "{split}" in data_dir or not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


REPAIR = "rerun the same `python -m data.prepare` command on it (it rewrites damaged shards and the manifest)"


def check_manifest(data_dir, manifest):
  """Cheap checks that the manifest tells the truth about its files (ConfigError naming the file otherwise): each
  listed file exists with its recorded size, the counts add up, the first file's records counted match its count,
  and every file's bytes per record fit the first file's (a count off by 2x or more cannot hide)."""
  for split, entry in manifest["splits"].items():
    files, counts, sizes = entry["files"], entry["counts"], entry.get("bytes") or [None] * len(entry["files"])
    if not len(files) == len(counts) == len(sizes) or sum(entry["class_counts"]) != sum(counts):
      raise ConfigError(f"{manifest_path(data_dir)}: split '{split}' does not add up ({len(files)} files, "
                        f"{len(counts)} counts summing to {sum(counts)}, class counts summing to "
                        f"{sum(entry['class_counts'])}); {REPAIR}")
    paths = [posixpath.join(data_dir, f) for f in files]
    for path, size in zip(paths, sizes):
      _check_size(path, size)
    if not paths:
      continue
    first = count_records(paths[:1])[0]
    if first != counts[0]:
      raise ConfigError(f"{paths[0]} holds {first} records, its manifest says {counts[0]}; {REPAIR}")
    if sizes[0] and first:
      _check_bytes_per_record(split, paths, counts, sizes, sizes[0] / first)


def _check_size(path, size):
  if not tf.io.gfile.exists(path):
    raise ConfigError(f"{path}, listed in its manifest, does not exist; {REPAIR}")
  actual = tf.io.gfile.stat(path).length
  if size is not None and actual != size:
    raise ConfigError(f"{path} has {actual} bytes, its manifest says {size} (truncated or replaced?); {REPAIR}")


def _check_bytes_per_record(split, paths, counts, sizes, per_record):
  for path, count, size in zip(paths, counts, sizes):
    ratio = size / count / per_record if count else float("inf")
    if not 0.5 <= ratio <= 2:
      raise ConfigError(f"the manifest's count for {path} ({count} records in {size} bytes, "
                        f"{size / max(count, 1):.0f} bytes each) does not fit split '{split}' ({per_record:.0f} bytes "
                        f"a record in {paths[0]}); {REPAIR}")


def verify_checksums(data_dir, manifest):
  """Every file's SHA-256 and record count against the manifest (reads every byte: --dry_run or
  data.tfrecord.verify); returns the number of files verified; ConfigError naming the first that differs."""
  verified = 0
  for entry in manifest["splits"].values():
    for name, count, digest in zip(entry["files"], entry["counts"], entry.get("sha256") or []):
      path = posixpath.join(data_dir, name)
      hasher = hashlib.sha256()
      with tf.io.gfile.GFile(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
          hasher.update(block)
      if hasher.hexdigest() != digest:
        raise ConfigError(f"{path} does not match its SHA-256 in the manifest (damaged or replaced); {REPAIR}")
      if count_records([path])[0] != count:
        raise ConfigError(f"{path} does not hold the {count} records its manifest says; {REPAIR}")
      verified += 1
  return verified


def parser(image_key, label_key):
  """fn(serialized tf.train.Example) -> (image bytes, int64 label): cheap (no image decoding)."""
  spec = {image_key: tf.io.FixedLenFeature([], tf.string), label_key: tf.io.FixedLenFeature([], tf.int64)}

  def parse(serialized):
    example = tf.io.parse_single_example(serialized, spec)
    return example[image_key], example[label_key]

  return parse


def decoder(image_format, image_shape, image_size=None):
  """fn(image bytes) -> uint8 image of the stored shape, resized to (image_size, image_size) when set."""
  shape = tuple(int(d) for d in image_shape)

  def decode(data):
    if image_format == "raw":
      image = tf.reshape(tf.io.decode_raw(data, tf.uint8), shape)
    else:
      image = tf.io.decode_image(data, channels=shape[-1], expand_animations=False)
    if image_size:
      image = tf.cast(tf.round(tf.image.resize(image, (image_size, image_size))), tf.uint8)
      return tf.ensure_shape(image, (image_size, image_size, shape[-1]))
    return tf.ensure_shape(image, shape)

  return decode


def count_records(paths):
  """Records in each file (read, not parsed: one pass over the bytes, files in parallel)."""
  counts = tf.data.Dataset.from_tensor_slices(list(paths)).map(
      lambda p: tf.data.TFRecordDataset(p).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return tuple(int(c) for c in counts.as_numpy_iterator())


def split_files(data_dir, split, manifest):
  """(paths, counts) of one split of data.data_dir (`data_dir`: a prepared directory with its manifest, or a
  {split} pattern when `manifest` is None)."""
  if manifest is not None:
    if split not in manifest["splits"]:
      raise ConfigError(f"prepared dataset {data_dir} has no split '{split}'; it has "
                        f"{', '.join(manifest['splits'])}")
    entry = manifest["splits"][split]
    return tuple(posixpath.join(data_dir, f) for f in entry["files"]), tuple(entry["counts"])
  pattern = data_dir.replace("{split}", split)
  paths = tuple(sorted(tf.io.gfile.glob(pattern)))
  if not paths:
    raise FileNotFoundError(f"no TFRecord files match {pattern} (data.data_dir={data_dir} with "
                            f"{{split}}={split}); prepare a dataset with `python -m data.prepare --config=... "
                            f"--out=DIR` or point data.data_dir at DIR/{{split}}-* files")
  return paths, _counted(paths)


def tfrecord(data_config):
  """The Source of data.data_dir (see the module doc; named features for a task: data/tfrecord_features.py)."""
  if data_config.tfrecord.features:
    from data import tfrecord_features  # pylint: disable=import-outside-toplevel  (it imports this module)
    return tfrecord_features.source(data_config)
  manifest = read_manifest(data_config.data_dir)
  settings = data_config.tfrecord
  if manifest is not None:
    check_manifest(data_config.data_dir, manifest)
    if settings.verify:
      verify_checksums(data_config.data_dir, manifest)
    image_format, image_shape = manifest["format"], manifest["image_shape"]
    num_classes, max_value = manifest["num_classes"], manifest.get("max_value", 255.0)
  else:
    if tf.io.gfile.isdir(data_config.data_dir):
      raise ConfigError(f"data.data_dir={data_config.data_dir} is a directory without {MANIFEST}: give a directory "
                        "written by `python -m data.prepare --config=... --out=DIR`, or a glob of TFRecord files "
                        "with {split} for the split name (e.g. DIR/{split}-*)")
    image_format, image_shape, num_classes, max_value = "encoded", settings.image_shape, settings.num_classes, 255.0
    if num_classes is None:
      raise ConfigError(f"data.tfrecord.num_classes must be set for TFRecord files without a manifest "
                        f"({data_config.data_dir}); `python -m data.prepare` writes one")
  train, evaluation = (split_files(data_config.data_dir, s, manifest) for s in (data_config.train_split,
                                                                         data_config.eval_split))
  parse = parser(settings.image_key, settings.label_key)
  _check_features(train[0], settings)
  if image_shape is None:
    image_shape = _first_image_shape(train[0], parse)
  return from_files(f"tfrecord:{data_config.data_dir}", train, evaluation, parse,
                    decoder(image_format, image_shape, data_config.image_size), image_shape, num_classes, max_value,
                    data_config)


def from_files(name, train, evaluation, parse, decode, image_shape, num_classes, max_value, data_config):
  """A Source over (paths, counts) of each split: streamed, or decoded into memory (data.in_memory)."""
  size = data_config.image_size
  shape = (size, size, int(image_shape[-1])) if size else tuple(int(d) for d in image_shape)
  train_files = records.RecordFiles(train[0], train[1], parse)
  eval_records = records_dataset(evaluation[0], parse)
  if data_config.in_memory:
    arrays = [_decode_all(records_dataset(paths, parse), decode) for paths in (train[0], evaluation[0])]
    return from_arrays(name, arrays[0], arrays[1], num_classes=num_classes, max_value=max_value)
  return Source(name=name, train=records_dataset(train[0], parse), eval=eval_records,
                        train_size=train_files.size, eval_size=int(sum(evaluation[1])), num_classes=int(num_classes),
                        image_shape=shape, max_value=float(max_value), decode=decode, train_files=train_files)


def records_dataset(paths, parse):
  """(image bytes, label) of every record of `paths`, in file order."""
  return tf.data.TFRecordDataset(list(paths)).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def tfds_files(builder, split):
  """(paths, counts) of a prepared tfds split's own shard files (whole splits only)."""
  if "[" in split:
    raise ConfigError(f"data.in_memory=False reads tfds' shard files of whole splits; '{split}' is a slice (set "
                      f"data.in_memory=True, or prepare the slice with `python -m data.prepare`)")
  info = builder.info.splits[split]
  return tuple(str(p) for p in info.filepaths), tuple(int(n) for n in info.shard_lengths)


def _decode_all(dataset, decode):
  images, labels = [], []
  for image, label in dataset.map(lambda data, label: (decode(data), label),
                                  num_parallel_calls=tf.data.AUTOTUNE).batch(1024).as_numpy_iterator():
    images.append(image)
    labels.append(label)
  return np.concatenate(images), np.concatenate(labels).astype(np.int64)


def _check_features(paths, settings):
  """ConfigError when the first record has no feature data.tfrecord.image_key / label_key (listing those it has)."""
  for serialized in tf.data.TFRecordDataset(list(paths[:1])).take(1).as_numpy_iterator():
    features = tf.train.Example.FromString(serialized).features.feature
    for key in ("image_key", "label_key"):
      name = getattr(settings, key)
      if name not in features:
        raise ConfigError(f"data.tfrecord.{key}='{name}' is not a feature of the records in {paths[0]}; "
                          f"they have: {', '.join(sorted(features))}")


def damaged_files(data_config):
  """The record files of data_config's splits (a prepared directory or a {split} glob) that cannot be read to the
  end; [] for other sources. Reads every file: for naming the file after a DataLossError."""
  if data_config.name != "tfrecord":
    return []
  manifest = read_manifest(data_config.data_dir)
  splits = (data_config.train_split, data_config.eval_split)
  if manifest is not None:
    paths = [posixpath.join(data_config.data_dir, f) for split in splits if split in manifest["splits"]
             for f in manifest["splits"][split]["files"]]
  else:
    paths = [p for split in splits for p in sorted(tf.io.gfile.glob(data_config.data_dir.replace("{split}", split)))]
  return _unreadable(paths)


def _unreadable(paths):
  damaged = []
  for path in paths:
    try:
      count_records([path])
    except tf.errors.OpError:
      damaged.append(path)
  return damaged


def _counted(paths):
  """count_records, with a file that cannot be read to the end named (ConfigError)."""
  try:
    return count_records(paths)
  except tf.errors.DataLossError as e:
    raise damaged(_unreadable(paths), e) from None


def damaged(files, error):
  """The ConfigError for record files that cannot be read (`error`: TensorFlow's DataLossError)."""
  detail = re.split(r": |}} ", first_line(error).split(" [Op:")[0])[-1].strip()
  where = f"{', '.join(files)} cannot be read to the end" if files else "a data file cannot be read to the end"
  return ConfigError(f"{where} ({detail}): damaged or truncated; replace it (a prepared directory: rerun the same "
                     "`python -m data.prepare` command on it)")


def _first_image_shape(paths, parse):
  for data, _ in records_dataset(paths[:1], parse).take(1):
    return tuple(int(d) for d in tf.io.decode_image(data, expand_animations=False).shape)
  raise ConfigError(f"the first TFRecord file {paths[0]} holds no records")
