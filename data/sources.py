"""Data sources: where examples come from, before any preprocessing or batching.

Each source returns unbatched `(image, label)` datasets in a fixed order, images in their stored dtype
(uint8 for tfds and synthetic), plus the metadata the rest of the run needs.
"""

import dataclasses
import functools
import io
import os
import re
import socket
import zipfile

from absl import logging
import numpy as np
import tensorflow as tf

from data import tfrecord as tfrecord_lib
from data import user_source
from data.loaded_source import Source, from_arrays
from errors import ConfigError, described, first_line, unknown_name


def digits(data_config):
  """scikit-learn's bundled 8x8 digits (real data, no download): fixed stratified 80/20 split."""
  from sklearn import datasets as sk_datasets
  from sklearn import model_selection

  images, labels = sk_datasets.load_digits(return_X_y=True)
  images = images.reshape(-1, 8, 8, 1).astype(np.uint8)  # values 0..16
  labels = labels.astype(np.int64)
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
      images, labels, test_size=0.2, stratify=labels, random_state=0)
  train, evaluation = _named_splits("digits", {"train": (x_train, y_train), "test": (x_test, y_test)}, data_config)
  return from_arrays("digits", train, evaluation, num_classes=10, max_value=16.0)


def _named_splits(name, splits, data_config, strict=True):
  """(train, eval) arrays of a source with the fixed splits {"train": ..., "test": ...}, by data.train_split and
  data.eval_split; not strict (synthetic stands in for any dataset's splits): another name is the split in its
  place."""
  chosen = []
  for key, place in (("train_split", "train"), ("eval_split", "test")):
    split = getattr(data_config, key)
    if split not in splits and strict:
      raise ConfigError(f"data.{key}='{split}': dataset '{name}' has the splits {', '.join(splits)}")
    chosen.append(splits.get(split, splits[place]))
  return chosen


def synthetic(data_config):
  """Random uint8 images and labels of the configured shape: for smoke runs and benchmarks only."""
  cfg = data_config.synthetic
  shape = tuple(int(d) for d in cfg.image_shape)
  rng = np.random.default_rng(1234)

  def make(n):
    images = rng.integers(0, 256, size=(n,) + shape, dtype=np.uint8)
    labels = rng.integers(0, cfg.num_classes, size=(n,), dtype=np.int64)
    return images, labels

  train, evaluation = _named_splits("synthetic", {"train": make(cfg.train_examples), "test": make(cfg.eval_examples)},
                                    data_config, strict=False)
  return from_arrays("synthetic", train, evaluation, num_classes=cfg.num_classes, max_value=255.0)


NPZ_KEYS = "x_train, y_train, x_test, y_test"
NPZ_HOW = (f"write one with np.savez(PATH, x_train=..., y_train=..., x_test=..., y_test=...) (e.g. the arrays of "
           f"keras.datasets.mnist.load_data()) and set data.data_dir=PATH")


def npz(data_config):
  """An .npz of x_train, y_train, x_test, y_test (keras.datasets' load_data() saved with np.savez), in memory.

  Split S (data.train_split, data.eval_split) reads x_S and y_S. Images: uint8 0-255, (N, H, W) (a channel axis is
  added) or (N, H, W, C); labels: integer class ids (N,) or (N, 1). num_classes = the largest id + 1 over both
  splits. Read through tf.io.gfile, so ram:// and gs:// paths work.
  """
  path = data_config.data_dir
  arrays = _read_npz(path)
  names = (data_config.train_split, data_config.eval_split)
  if data_config.npz.features or data_config.npz.targets:
    return user_source.load(f"npz:{path}", lambda split: _named_arrays(arrays, data_config, names, split, path))
  needed = list(dict.fromkeys(f"{xy}_{name}" for name in names for xy in "xy"))
  missing = [key for key in needed if key not in arrays.files]
  if missing:
    raise ConfigError(f"npz file '{path}' has no {', '.join(missing)} (data.train_split='{names[0]}' and "
                      f"data.eval_split='{names[1]}' need {', '.join(needed)}); it has: "
                      f"{', '.join(arrays.files) or 'no arrays'}")
  train, evaluation = (_npz_split(arrays, name, path) for name in names)
  if train[0].shape[1:] != evaluation[0].shape[1:]:
    raise ConfigError(f"npz file '{path}': x_{names[1]} images are {evaluation[0].shape[1:]} but x_{names[0]} are "
                      f"{train[0].shape[1:]} (height, width, channels); they must match")
  num_classes = _check_class_ids(train[1], evaluation[1], path, names)
  return from_arrays(f"npz:{path}", train, evaluation, num_classes=num_classes, max_value=255.0)


def _named_arrays(arrays, data_config, names, split, path):
  """(features, targets) of split "train"/"eval": the arrays data.npz.features / .targets name, suffixed _S."""
  features, targets = tuple(data_config.npz.features), tuple(data_config.npz.targets)
  if not (features and targets):
    raise ConfigError(f"data.npz.features={features} and data.npz.targets={targets}: name both (arrays of the npz "
                      f"file, without the _<split> suffix) or neither (the classic {NPZ_KEYS})")
  suffix = names[0] if split == "train" else names[1]
  keys = [f"{name}_{suffix}" for name in features + targets]
  missing = [key for key in keys if key not in arrays.files]
  if missing:
    raise ConfigError(f"npz file '{path}' has no {', '.join(missing)} (data.npz.features and data.npz.targets name "
                      f"arrays read as <name>_{suffix}); it has: {', '.join(arrays.files) or 'no arrays'}")
  read = lambda group: (_npz_array(arrays, f"{group[0]}_{suffix}", path) if len(group) == 1 else
                        {name: _npz_array(arrays, f"{name}_{suffix}", path) for name in group})
  return read(features), read(targets)


def _npz_array(arrays, key, path):
  """arrays[key], or one ConfigError naming the file and the array when it cannot be read."""
  try:
    return arrays[key]
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:  # object arrays (pickles), a damaged member
    hint = ("it holds Python objects (dtype object), which are not read: save numbers or strings of one dtype, e.g. "
            "np.asarray(values, dtype=np.float32)" if "allow_pickle" in str(e) else first_line(e))
    raise ConfigError(f"npz file '{path}': array '{key}' cannot be read: {hint}") from None


def _check_class_ids(train_labels, eval_labels, path, names):
  """The number of classes: train labels must be 0..C-1 with every class present, eval labels among them."""
  present = np.unique(train_labels)
  num_classes = int(present[-1]) + 1 if len(present) else 0
  if len(present) != num_classes:
    absent = sorted(set(range(num_classes)) - set(present.tolist()))
    raise ConfigError(f"npz file '{path}': y_{names[0]} must hold class ids 0..C-1 with every class present; ids "
                      f"{_id_list(absent)} of 0..{num_classes - 1} have no example (relabel to 0..{len(present) - 1})")
  unseen = np.setdiff1d(np.unique(eval_labels), present)
  if len(unseen):
    raise ConfigError(f"npz file '{path}': y_{names[1]} has class ids {_id_list(unseen.tolist())} that "
                      f"y_{names[0]} lacks (classes 0..{num_classes - 1}); the model could never predict them")
  return num_classes


def _id_list(ids, shown=8):
  return ", ".join(map(str, ids[:shown])) + (f", ... ({len(ids)} in all)" if len(ids) > shown else "")


def _read_npz(path):
  if not tf.io.gfile.exists(path):
    raise ConfigError(f"npz file '{path}' does not exist; {NPZ_HOW}")
  with tf.io.gfile.GFile(path, "rb") as f:
    content = f.read()
  if not content.startswith(b"PK"):  # an .npz is a zip archive of .npy files
    what = "one .npy array" if content.startswith(b"\x93NUMPY") else "not a zip archive"
    raise ConfigError(f"'{path}' is {what}, not an .npz archive of {NPZ_KEYS}; {NPZ_HOW}")
  try:
    return np.load(io.BytesIO(content), allow_pickle=False)
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
    raise ConfigError(f"'{path}' is not a readable .npz archive ({first_line(e)}); {NPZ_HOW}") from None


def _npz_split(arrays, split, path):
  """(uint8 images (N, H, W, C), int64 labels (N,)) of one split, or one ConfigError naming what is wrong."""
  x_key, y_key = f"x_{split}", f"y_{split}"
  try:
    images, labels = arrays[x_key], arrays[y_key]
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:  # object arrays (pickles), a damaged member
    raise ConfigError(f"npz file '{path}': {x_key} or {y_key} cannot be read ({first_line(e)}); the file is damaged "
                      f"or not written by np.savez") from None
  if images.ndim not in (3, 4) or images.dtype != np.uint8:
    raise ConfigError(f"npz file '{path}': {x_key} must be uint8 images (N, H, W) or (N, H, W, C) with pixels "
                      f"0-255, got {images.dtype} of shape {images.shape}")
  if images.ndim == 3:
    images = images[..., np.newaxis]
  if labels.dtype.kind not in "iu" or not (labels.ndim == 1 or labels.ndim == 2 and labels.shape[1] == 1):
    raise ConfigError(f"npz file '{path}': {y_key} must be integer class ids of shape (N,) or (N, 1), got "
                      f"{labels.dtype} of shape {labels.shape}")
  labels = labels.reshape(-1)
  if len(labels) != len(images):
    raise ConfigError(f"npz file '{path}': {x_key} has {len(images)} images but {y_key} has {len(labels)} labels; "
                      f"they must be equally many")
  if len(labels) and labels.min() < 0:
    raise ConfigError(f"npz file '{path}': {y_key} has negative labels (smallest {labels.min()}); class ids must "
                      f"be 0, 1, ..., num_classes - 1")
  return images, labels.astype(np.int64)


DOWNLOAD_PROBE = ("storage.googleapis.com", 443)  # where tfds looks first (its GCS mirror) for every dataset


def network_unreachable(timeout_seconds=5.0):
  """None when a TCP connection to DOWNLOAD_PROBE opens within the timeout, else why not (one short line)."""
  address = DOWNLOAD_PROBE
  try:
    socket.create_connection(address, timeout=timeout_seconds).close()
    return None
  except OSError as e:
    return f"{address[0]}:{address[1]} unreachable: {e.strerror or type(e).__name__}"


def tfds_source(tfds_name):
  """A tensorflow_datasets dataset with 'image' and 'label' features."""

  def load(data_config):
    import tensorflow_datasets as tfds

    try:
      builder = tfds.builder(tfds_name, data_dir=data_config.data_dir)
    except Exception as e:  # DatasetNotFoundError and friends
      raise LookupError(f"tfds has no dataset '{tfds_name}': {first_line(e)}") from None
    where = data_config.data_dir or "~/tensorflow_datasets"
    how = (f"provide it with `tfds build {tfds_name} --data_dir=DIR` on a machine with network, copy DIR "
           f"here and set --config.data.data_dir=DIR")
    if not builder.is_prepared():
      if not data_config.download:
        raise FileNotFoundError(f"tfds dataset '{tfds_name}' is not in {where} and data.download is False; {how}")
      offline = network_unreachable()
      if offline:  # tfds would spend minutes in retries (measured 3 min 24 s) before failing
        raise FileNotFoundError(f"tfds dataset '{tfds_name}' is not in {where} and this machine has no network "
                                f"({offline}); {how}")
      try:
        builder.download_and_prepare()
      except Exception as e:
        raise FileNotFoundError(f"tfds dataset '{tfds_name}' is not in {where} and could not be downloaded "
                                f"({described(e)}); {how}") from None
    features = builder.info.features
    if "image" not in features or "label" not in features:
      raise ValueError(f"tfds dataset '{tfds_name}' has no 'image'/'label' features (it has {list(features)})")
    if not data_config.in_memory:  # tfds' own shard files, each pipeline its own; images decoded after sharding
      image = features["image"]
      if None in image.shape[:2] and not data_config.image_size:
        raise ConfigError(f"tfds dataset '{tfds_name}' has images of varying size {image.shape}; set "
                          f"data.image_size to stream it")
      shape = tuple(d or data_config.image_size for d in image.shape)
      return tfrecord_lib.from_files(
          tfds_name, *(tfrecord_lib.tfds_files(builder, s) for s in (data_config.train_split, data_config.eval_split)),
          tfrecord_lib.parser("image", "label"), tfrecord_lib.decoder("encoded", shape, data_config.image_size),
          shape, features["label"].num_classes, 255.0, data_config)

    def split(name):
      ds = builder.as_dataset(split=name, as_supervised=False, shuffle_files=False)
      return ds.map(lambda ex: (ex["image"], ex["label"]), num_parallel_calls=tf.data.AUTOTUNE)

    train, evaluation = split(data_config.train_split), split(data_config.eval_split)
    return from_arrays(tfds_name, _to_numpy(train), _to_numpy(evaluation),  # whole splits in memory
                       num_classes=features["label"].num_classes, max_value=255.0)

  return load


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
CORRUPT_IMAGE_POLICIES = ("fail", "skip")


def image_folder(data_config):
  """Images in data_dir/<split>/<class name>/*.{png,jpg,jpeg,gif,bmp,webp}, listed through tf.io.gfile.

  Classes are the sorted sub-directories of the train split. data.in_memory=True decodes every image once into
  memory (resized to data.image_size when set); False streams them: (path, label) records that the pipeline
  shuffles, shards and skips, decoding only the images it keeps (see _streamed_folder). Either way an unreadable
  or corrupt file stops the load naming it (data.corrupt_images=fail) or is left out and counted (skip).
  """
  root, policy = data_config.data_dir, data_config.corrupt_images
  train_dir = os.path.join(root, data_config.train_split)
  if not tf.io.gfile.isdir(train_dir):
    raise FileNotFoundError(f"image folder '{train_dir}' does not exist (expected ROOT/<split>/<class>/<images> "
                            f"with ROOT=data.data_dir and split=data.train_split)")
  classes = _sub_directories(train_dir)
  if not classes:
    raise ValueError(f"image folder '{train_dir}' has no class sub-directories")
  files = _image_files(train_dir, classes)
  empty = sorted(set(classes) - {classes[label] for _, label in files})
  if empty:
    raise ConfigError(f"image folder '{train_dir}': class folder(s) {', '.join(empty)} hold no images; a class "
                      f"without training images cannot be learned (remove the folder or add images)")
  first = files[:1]
  channels = int(tf.io.decode_image(tf.io.read_file(first[0][0]), expand_animations=False).shape[-1]) if first else 3
  if not data_config.in_memory:
    return _streamed_folder(root, classes, channels, data_config)
  splits = [_decode_folder(os.path.join(root, split), classes, channels, data_config.image_size, policy)
            for split in (data_config.train_split, data_config.eval_split)]
  return from_arrays(f"image_folder:{root}", *splits, num_classes=len(classes), max_value=255.0)


def _sub_directories(directory):
  names = (name.rstrip("/") for name in tf.io.gfile.listdir(directory))  # gs:// lists directories as "name/"
  return sorted(name for name in names if tf.io.gfile.isdir(os.path.join(directory, name)))


def _image_files(split_dir, classes):
  files = []
  for label, name in enumerate(classes):
    directory = os.path.join(split_dir, name)
    if tf.io.gfile.isdir(directory):
      files += [(os.path.join(directory, f), label) for f in sorted(tf.io.gfile.listdir(directory))
                if f.lower().endswith(IMAGE_SUFFIXES)]
  return files


def _split_files(split_dir, classes):
  """(path, label) of every image of one split; its class folders must be among the train split's."""
  if not tf.io.gfile.isdir(split_dir):
    raise FileNotFoundError(f"image folder '{split_dir}' does not exist")
  unknown = sorted(set(_sub_directories(split_dir)) - set(classes))
  if unknown:
    raise ValueError(f"'{split_dir}' has class folders that the train split lacks: {', '.join(unknown[:5])}")
  return _image_files(split_dir, classes)


def _decode_file(path, channels, size, shape=None):
  """uint8 image of one file, resized to (size, size) when size is set: the same ops in memory and streamed.
  shape: the static shape every image must have (streamed batches need it)."""
  image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)
  if size:
    image = tf.cast(tf.round(tf.image.resize(image, (size, size))), tf.uint8)
  return image if shape is None else tf.ensure_shape(image, shape)


def image_files(source, where):
  """(source whose eval split is the images under `where` (a directory, searched recursively, or a glob), each
  decoded to the source's stored image shape and value range, labels -1; their paths in that order, sorted), for
  mode=predict on new, unlabeled images."""
  if source.image_shape is None or source.eval.element_spec[0].dtype != tf.uint8:
    raise ConfigError(f"predict.input='{where}': image files need a model trained on images (uint8 [H, W, C]); "
                      f"this run's data '{source.name}' has features {source.eval.element_spec[0]}")
  paths = _files_under(where)
  if not paths:
    raise ConfigError(f"predict.input='{where}': no image files ({', '.join(IMAGE_SUFFIXES)}) there")
  shape = tuple(int(d) for d in source.image_shape)
  scale = source.max_value / 255.0  # a file's 8-bit 0..255 is the source's 0..max_value (digits: 0..16)

  def decode(path):
    image = tf.image.resize(_decode_file(path, shape[-1], None), shape[:2]) * scale
    return tf.ensure_shape(tf.cast(tf.round(image), tf.uint8), shape)

  label = tf.zeros([], source.eval.element_spec[1].dtype) - 1
  records = tf.data.Dataset.from_tensor_slices(paths).map(lambda path: (path, label))
  return dataclasses.replace(source, eval=records, eval_size=len(paths), decode=decode), paths


def _files_under(where):
  """Sorted image files of a directory (recursively) or of a glob pattern."""
  if tf.io.gfile.isdir(where):
    found = [os.path.join(root, name) for root, _, names in tf.io.gfile.walk(where) for name in names]
  else:
    found = tf.io.gfile.glob(where)
  return sorted(path for path in found if path.lower().endswith(IMAGE_SUFFIXES))


def _unreadable(path, error):
  """ConfigError for a file that does not decode (data.corrupt_images=fail)."""
  reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\].*$", "", error.message).strip()
  return ConfigError(f"image {path} is unreadable or corrupt ({reason}); set data.corrupt_images=skip to "
                     f"leave such files out (valid: {', '.join(CORRUPT_IMAGE_POLICIES)})")


DECODE_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.PermissionDeniedError)


def _report_skipped(skipped, split_dir):
  if skipped:
    logging.warning("skipped %d unreadable or corrupt image(s) in %s (data.corrupt_images=skip): %s%s",
                    len(skipped), split_dir, ", ".join(skipped[:3]), ", ..." if len(skipped) > 3 else "")


def _different_sizes(path, shape, first_shape):
  shape, first_shape = (tuple(int(d) for d in s[:2]) for s in (shape, first_shape))
  return ValueError(f"images differ in size ({path} is {shape}, {first_shape} before): "
                    f"set data.image_size to resize them all")


def _decode_folder(split_dir, classes, channels, size, policy):
  images, labels, skipped = [], [], []
  for path, label in _split_files(split_dir, classes):
    try:
      image = _decode_file(path, channels, size)
    except DECODE_ERRORS as e:
      if policy == "fail":
        raise _unreadable(path, e) from None
      skipped.append(path)
      continue
    if not size and images and image.shape != images[0].shape:
      raise _different_sizes(path, image.shape, images[0].shape)
    images.append(image.numpy())
    labels.append(label)
  _report_skipped(skipped, split_dir)
  if not images:
    return np.zeros((0, 1, 1, channels), np.uint8), np.zeros((0,), np.int64)
  return np.stack(images), np.array(labels, np.int64)


def _streamed_folder(root, classes, channels, data_config):
  """A Source of (path, label) records and a decode function: no image is held in memory.

  Every file is decoded once up front in a parallel tf.data pass that keeps only its shape (cost: one decode
  epoch, no memory), so a corrupt file stops the load naming it or is left out before the sizes are counted, and
  a size mismatch is found before training. The train/eval sizes are then exact, as in memory.
  """
  size, splits, shapes = data_config.image_size, [], []
  for split in (data_config.train_split, data_config.eval_split):
    split_dir = os.path.join(root, split)
    files, split_shapes = _readable_files(_split_files(split_dir, classes), channels, size,
                                          data_config.corrupt_images, split_dir)
    splits.append(files)
    shapes.append(split_shapes)
  shapes = np.concatenate(shapes)
  if not len(shapes):
    shapes = np.array([(size or 1, size or 1, channels)])
  different = np.flatnonzero(np.any(shapes != shapes[0], axis=1))
  if len(different):  # only without data.image_size: decoding resizes otherwise
    raise _different_sizes((splits[0] + splits[1])[different[0]][0], shapes[different[0]], shapes[0])
  image_shape = tuple(int(d) for d in shapes[0])

  def records(files):
    paths, labels = [p for p, _ in files], [label for _, label in files]
    return tf.data.Dataset.from_tensor_slices((tf.constant(paths, tf.string), tf.constant(labels, tf.int64)))

  decode = functools.partial(_decode_file, channels=channels, size=size, shape=image_shape)
  train_records = (np.array([p for p, _ in splits[0]], object), np.array([l for _, l in splits[0]], np.int64))
  return Source(name=f"image_folder:{root}", train=records(splits[0]), eval=records(splits[1]),
                train_size=len(splits[0]), eval_size=len(splits[1]), num_classes=len(classes),
                image_shape=image_shape, max_value=255.0, decode=decode, train_records=train_records)


def _readable_files(files, channels, size, policy, split_dir):
  """(the files that decode, their decoded shapes as an (N, 3) array): one parallel pass that drops failures
  (ignore_errors) and finds them by their missing indices."""
  paths = tf.constant([p for p, _ in files], tf.string)
  shapes = tf.data.Dataset.from_tensor_slices(paths).enumerate().map(
      # the decoded shape, not the resized one: a static (size, size) shape would let TensorFlow skip the decode
      lambda i, path: (i, tf.shape(_decode_file(path, channels, None), tf.int64)), num_parallel_calls=tf.data.AUTOTUNE)
  readable, decoded = np.zeros(len(files), bool), np.zeros((len(files), 3), np.int64)
  for i, shape in shapes.ignore_errors().batch(4096).as_numpy_iterator():
    readable[i], decoded[i] = True, (size, size, channels) if size else shape
  unreadable = [path for (path, _), ok in zip(files, readable) if not ok]
  if unreadable and policy == "fail":
    try:
      _decode_file(unreadable[0], channels, size)
    except DECODE_ERRORS as e:
      raise _unreadable(unreadable[0], e) from None
    raise ConfigError(f"image {unreadable[0]} failed to decode once, then decoded: is the folder being written to?")
  _report_skipped(unreadable, split_dir)
  return [file for file, ok in zip(files, readable) if ok], decoded[readable]


SOURCES = {
    "digits": digits,
    "synthetic": synthetic,
    "mnist": tfds_source("mnist"),
    "fashion_mnist": tfds_source("fashion_mnist"),
    "cifar10": tfds_source("cifar10"),
    "cifar100": tfds_source("cifar100"),
    "quickdraw_bitmap": tfds_source("quickdraw_bitmap"),
    "image_folder": image_folder,
    "npz": npz,
    "tfrecord": tfrecord_lib.tfrecord,
}
TFDS_PREFIX = "tfds:"


def resolve(name):
  """The loader of data.name (a registry name or "tfds:<any tfds name>"); the one check of the name (loops/rules.py
  and data/prepare.py call it)."""
  if name.startswith(TFDS_PREFIX):
    return tfds_source(name[len(TFDS_PREFIX):])
  if user_source.is_user_function(name):
    return user_source.resolve(name)
  if name not in SOURCES:
    raise unknown_name("dataset", name, list(SOURCES) + [TFDS_PREFIX + "<tfds name>", "package.module:function"])
  return SOURCES[name]


def load(data_config, streams=None, eval_stream=None):
  """Returns the Source named by data_config.name; with a task's named streams ({name: multiple}, its eval
  stream) an input function read per stream (data/user_stream.py)."""
  name = data_config.name
  source = user_source.load_streams(name, streams, eval_stream) if streams else resolve(name)(data_config)
  if source.train_size == 0 or source.eval_size == 0:
    raise ValueError(f"dataset '{name}' is empty: {source.train_size} train and {source.eval_size} eval examples")
  if source.num_classes == 0:  # a task's data: its classes, when it has any
    source = dataclasses.replace(source, num_classes=data_config.num_classes or _classes_of(source))
  return source


def _classes_of(source):
  """The largest class id + 1 of an array source whose targets are integer class ids [N]; else 0 (unknown)."""
  targets = source.train_arrays[1] if source.train_arrays is not None else None
  if isinstance(targets, np.ndarray) and targets.ndim == 1 and targets.dtype.kind in "iu" and targets.size:
    return int(targets.max()) + 1 if targets.min() >= 0 else 0
  return 0


def _to_numpy(ds):
  images, labels = [], []
  for x, y in ds.batch(4096).as_numpy_iterator():
    images.append(x)
    labels.append(y)
  if not labels:
    return np.zeros((0,), np.uint8), np.zeros((0,), np.int64)
  return np.concatenate(images), np.concatenate(labels).astype(np.int64)
