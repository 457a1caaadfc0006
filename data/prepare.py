"""Prepare once: a config's dataset written as sharded TFRecords at the training resolution, read cheaply afterwards.

  python -m data.prepare --config=configs/X.py --out=DIR [--format=jpeg|raw] [--quality=95] [--config.data.*=...]

Every split (data.train_split, data.eval_split) of any source (image_folder, npz, digits, tfds, tfrecord) is
resized to data.image_size (when set), encoded as JPEG at --quality or kept as raw uint8, and written in a seeded
random order (so every shard mixes the classes; a streamed source of record files keeps its stored order) to
DIR/<split>-<i>-of-<n>.tfrecord, as tf.train.Examples with `image` and `label` (tfds' keys). Images are decoded,
resized and encoded by a tf.data pipeline over all cores. A shard is written under a temporary name and renamed
when complete, and DIR/prepare-state.json records each finished shard with its checksum: a killed prepare goes on
where it stopped (the same command), and no half-written shard is ever read. DIR/manifest.json, written last,
holds the counts per split and class, the image shape and format, and a checksum per shard. The command prints the
--config.data.* flags that train on DIR. Corrupt images follow data.corrupt_images, as in a run.
"""

import hashlib
import json
import math
import posixpath
import sys
import time

from data import quiet_start

if __name__ == "__main__":
  quiet_start.for_a_command_line()

from absl import app  # pylint: disable=wrong-import-position
from absl import flags  # pylint: disable=wrong-import-position
from ml_collections import config_flags  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position

from data import pipeline
from data import sources
from data import tfrecord
from errors import ConfigError

FORMATS = {"jpeg": "encoded", "raw": "raw"}
STATE = "prepare-state.json"
TARGET_SHARD_BYTES = 64 * 2**20
MIN_TRAIN_SHARDS = 32  # files enough for data.streams (default 8) split over several workers


def prepare(data_config, out, image_format="jpeg", quality=95, train_shards=0, seed=0, progress=None):
  """Writes (or completes) the prepared dataset in `out`.

  Args:
    data_config: the `data` section of a config (any source).
    out: the output directory (any tf.io.gfile path).
    image_format: "jpeg" (re-encoded at `quality`) or "raw" (uint8 pixels).
    train_shards: files of the train split (0: about TARGET_SHARD_BYTES each, at least MIN_TRAIN_SHARDS).
    seed: keys the order examples are written in.
    progress: fn(line) for progress lines (default: stderr).

  Returns:
    The manifest (also written to out/manifest.json).
  """
  if image_format not in FORMATS:
    raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got '{image_format}'")
  if not 1 <= quality <= 100:
    raise ConfigError(f"--quality must be in 1..100, got {quality}")
  sources.resolve(data_config.name)
  source = sources.load(data_config)
  shape = tuple(int(d) for d in pipeline.output_shape(source, data_config.image_size))
  settings = {"source": data_config.name, "data_dir": data_config.data_dir, "image_size": data_config.image_size,
              "format": image_format, "quality": quality if image_format == "jpeg" else None, "seed": seed,
              "splits": [data_config.train_split, data_config.eval_split], "train_shards": train_shards}
  writer = ShardWriter(out, settings, progress or (lambda line: print(line, file=sys.stderr, flush=True)))
  manifest = {"format": FORMATS[image_format], "quality": settings["quality"], "image_shape": list(shape),
              "num_classes": source.num_classes, "max_value": 255.0 if image_format == "jpeg" else source.max_value,
              "prepared_from": settings, "splits": {}}
  for split, is_train in ((data_config.train_split, True), (data_config.eval_split, False)):
    examples = Examples(source, data_config, is_train, shape, image_format, quality, seed)
    shards = train_shards if is_train and train_shards else examples.shard_count(MIN_TRAIN_SHARDS if is_train else 1)
    manifest["splits"][split] = writer.write_split(split, examples, shards, source.num_classes)
  with tf.io.gfile.GFile(tfrecord.manifest_path(out), "w") as f:
    f.write(json.dumps(manifest, indent=1) + "\n")
  return manifest


class Examples:
  """One split's examples as serialized tf.train.Examples, in the order they are written."""

  def __init__(self, source, data_config, is_train, shape, image_format, quality, seed):
    self.size = source.train_size if is_train else source.eval_size
    self.order = np.random.default_rng([seed, int(is_train)]).permutation(self.size)
    held = source.train_arrays if is_train else None
    if is_train and held is None:
      held = source.train_records
    if not is_train and source.decode is None:
      held = next(source.eval.batch(max(self.size, 1)).as_numpy_iterator()) if self.size else None
    self.held, self.stored = held, source.train if is_train else source.eval
    self.decode = source.decode or (lambda image: image)
    self.shape, self.format, self.quality = shape, image_format, quality
    self.scale = 255.0 / source.max_value if image_format == "jpeg" and source.max_value != 255.0 else None

  def dataset(self, begin, end):
    """(image data as bytes, or uint8 pixels for raw; label) of examples [begin, end) of the written order."""
    if self.held is not None:  # in memory: the seeded order itself
      picked = self.order[begin:end]
      ds = tf.data.Dataset.from_tensor_slices((self.held[0][picked], self.held[1][picked]))
    else:  # streamed records: their stored order (their writer mixed them), from `begin`
      ds = self.stored.skip(begin).take(end - begin)
    return ds.map(self._encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  def _encode(self, record, label):
    image = self.decode(record)
    if tuple(image.shape[:2]) != self.shape[:2]:
      image = tf.cast(tf.round(tf.image.resize(image, self.shape[:2])), tf.uint8)
    image = tf.ensure_shape(tf.cast(image, tf.uint8), self.shape)
    if self.format == "raw":
      return image, tf.cast(label, tf.int64)
    if self.scale:  # e.g. digits' 0..16: JPEG keeps 8-bit pixels, so they are spread over 0..255
      image = tf.cast(tf.round(tf.cast(image, tf.float32) * self.scale), tf.uint8)
    return tf.io.encode_jpeg(image, quality=self.quality), tf.cast(label, tf.int64)

  def shard_count(self, minimum):
    """Shards of about TARGET_SHARD_BYTES, judged from the first examples' size; at least `minimum` (and at most
    one per example)."""
    sample = min(self.size, 64)
    if not sample:
      return 1
    data = [_bytes(x) for x, _ in self.dataset(0, sample).as_numpy_iterator()]
    total = sum(len(d) for d in data) / sample * self.size
    return int(min(self.size, max(minimum, math.ceil(total / TARGET_SHARD_BYTES))))


def _bytes(data):
  return data.tobytes() if isinstance(data, np.ndarray) else data


def example(data, label):
  return tf.train.Example(features=tf.train.Features(feature={
      "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_bytes(data)])),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString(
      deterministic=True)  # the map of features in one order: the same bytes in every process


class ShardWriter:
  """Writes shards under temporary names, renames each when complete and records it in prepare-state.json."""

  def __init__(self, out, settings, progress):
    self.out, self.progress = out, progress
    if tf.io.gfile.exists(out) and not tf.io.gfile.isdir(out):
      raise ConfigError(f"--out={out} is a file, not a directory; give a new or empty directory")
    tf.io.gfile.makedirs(out)
    self.state_path = posixpath.join(out, STATE)
    self.state = {"settings": settings, "done": {}}
    if not tf.io.gfile.exists(self.state_path) and tf.io.gfile.listdir(out):
      raise ConfigError(f"--out={out} is not empty and holds no prepare ({STATE}): nothing in it is replaced; give "
                        "a new or empty directory (or the --out of an earlier prepare with the same settings)")
    if tf.io.gfile.exists(self.state_path):
      with tf.io.gfile.GFile(self.state_path) as f:
        earlier = json.load(f)
      if earlier["settings"] != settings:
        changed = ", ".join(f"{k}: {earlier['settings'].get(k)} -> {v}" for k, v in settings.items()
                            if earlier["settings"].get(k) != v)
        raise ConfigError(f"{out} holds a prepare with other settings ({changed}); use another --out or delete it")
      self.state = earlier
    else:
      self._save_state()  # first: a prepare killed in its first shard is still known as one

  def write_split(self, split, examples, shards, num_classes):
    """Writes the split's missing shards; returns its manifest entry."""
    entry = {"files": [], "counts": [], "class_counts": [0] * num_classes, "sha256": [], "bytes": []}
    started, written, kept = time.monotonic(), 0, 0
    for i in range(shards):
      name = f"{split}-{i:05d}-of-{shards:05d}.tfrecord"
      begin, end = i * examples.size // shards, (i + 1) * examples.size // shards  # sizes differ by 1 at most
      record = self.state["done"].get(name)
      if record is None or not self._intact(name, record):
        record = self._write(name, examples, begin, end)
        written += end - begin
        self._report(split, i + 1, shards, end, examples.size, written, started)
      else:
        kept += 1
      for label, count in record["class_counts"].items():
        entry["class_counts"][int(label)] += count
      for key, value in (("files", name), ("counts", end - begin), ("sha256", record["sha256"]),
                         ("bytes", record["bytes"])):
        entry[key].append(value)
    if kept:
      self.progress(f"prepare {split}: {kept} of {shards} shards were written before (their checksums match)")
    return entry

  def _write(self, name, examples, begin, end):
    path, temporary = posixpath.join(self.out, name), posixpath.join(self.out, f".{name}.partial")
    digest, classes = hashlib.sha256(), {}
    with tf.io.TFRecordWriter(temporary) as records:
      for data, label in examples.dataset(begin, end).as_numpy_iterator():
        serialized = example(data, label)
        records.write(serialized)
        classes[str(int(label))] = classes.get(str(int(label)), 0) + 1
    with tf.io.gfile.GFile(temporary, "rb") as f:
      content = f.read()
    digest.update(content)
    tf.io.gfile.rename(temporary, path, overwrite=True)
    record = {"sha256": digest.hexdigest(), "bytes": len(content), "class_counts": classes}
    self.state["done"][name] = record
    self._save_state()
    return record

  def _save_state(self):
    with tf.io.gfile.GFile(self.state_path + ".tmp", "w") as f:
      f.write(json.dumps(self.state))
    tf.io.gfile.rename(self.state_path + ".tmp", self.state_path, overwrite=True)

  def _intact(self, name, record):
    path = posixpath.join(self.out, name)
    if not tf.io.gfile.exists(path):
      return False
    with tf.io.gfile.GFile(path, "rb") as f:
      return hashlib.sha256(f.read()).hexdigest() == record["sha256"]

  def _report(self, split, shard, shards, done, total, written, started):
    seconds = time.monotonic() - started
    rate = written / seconds if written and seconds > 0 else 0.0
    eta = (total - done) / rate if rate else 0.0
    bar = "#" * int(30 * done / max(total, 1))
    self.progress(f"prepare {split}: [{bar:<30}] shard {shard}/{shards}, {done}/{total} examples, "
                  f"{rate:.0f} images/s, ETA {int(eta) // 60}:{int(eta) % 60:02d}")


def training_flags(out, manifest):
  return (f"--config.data.name=tfrecord --config.data.data_dir={out} --config.data.in_memory=False "
          f"--config.data.image_size={manifest['image_shape'][0]}")


def define_flags():
  """The command's flags (defined only when it runs as a command: importing this module defines none)."""
  return {"config": config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:arg]) to prepare."),
          "out": flags.DEFINE_string("out", None, "Output directory (any tf.io.gfile path)."),
          "format": flags.DEFINE_enum("format", "jpeg", list(FORMATS), "jpeg: re-encoded at --quality; raw: uint8."),
          "quality": flags.DEFINE_integer("quality", 95, "JPEG quality (1-100)."),
          "train_shards": flags.DEFINE_integer("train_shards", 0, "Train split files (0: ~64 MiB each, >= 32)."),
          "seed": flags.DEFINE_integer("seed", 0, "Seed of the order the examples are written in.")}


def main(given):
  try:
    manifest = prepare(given["config"].value.data, given["out"].value, given["format"].value, given["quality"].value,
                       given["train_shards"].value, given["seed"].value)
  except (ConfigError, FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {str(e).strip().splitlines()[0]}")
  counts = {split: sum(entry["counts"]) for split, entry in manifest["splits"].items()}
  print(f"prepared {counts} examples of {manifest['image_shape']} ({manifest['format']}) in {given['out'].value}; "
        f"train on it with:\n  {training_flags(given['out'].value, manifest)}")


if __name__ == "__main__":
  defined = define_flags()
  flags.mark_flags_as_required(["config", "out"])
  app.run(lambda argv: main(defined) if len(argv) == 1 else sys.exit(f"error: unexpected arguments {argv[1:]}"))
