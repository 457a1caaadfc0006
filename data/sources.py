"""Data sources: where examples come from, before any preprocessing or batching.

Each source returns unbatched `(image, label)` datasets in a fixed order, images in their stored dtype
(uint8 for tfds and synthetic), plus the metadata the rest of the run needs.
"""

import dataclasses
import os
import re
import socket

from absl import logging
import numpy as np
import tensorflow as tf

from loops.errors import first_line, unknown_name


@dataclasses.dataclass(frozen=True)
class Source:
  """train/eval: unbatched (image, label) datasets in a fixed order. When the train split is loaded in memory,
  train_arrays holds it as numpy (images, labels) so the pipeline can shuffle all of it by index."""
  name: str
  train: tf.data.Dataset
  eval: tf.data.Dataset
  train_size: int
  eval_size: int
  num_classes: int
  image_shape: tuple  # stored shape (H, W, C), before resizing.
  max_value: float  # pixel value that maps to 1.0.
  train_arrays: tuple = None


def from_arrays(name, train, evaluation, num_classes, max_value):
  """A Source held in memory: train and evaluation are (images, labels) numpy pairs."""
  return Source(
      name=name,
      train=tf.data.Dataset.from_tensor_slices(train),
      eval=tf.data.Dataset.from_tensor_slices(evaluation),
      train_size=len(train[1]), eval_size=len(evaluation[1]), num_classes=num_classes,
      image_shape=tuple(train[0].shape[1:]), max_value=max_value, train_arrays=train)


def digits(data_config):
  """scikit-learn's bundled 8x8 digits (real data, no download): fixed stratified 80/20 split."""
  from sklearn import datasets as sk_datasets
  from sklearn import model_selection

  images, labels = sk_datasets.load_digits(return_X_y=True)
  images = images.reshape(-1, 8, 8, 1).astype(np.uint8)  # values 0..16
  labels = labels.astype(np.int64)
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
      images, labels, test_size=0.2, stratify=labels, random_state=0)
  return from_arrays("digits", (x_train, y_train), (x_test, y_test), num_classes=10, max_value=16.0)


def synthetic(data_config):
  """Random uint8 images and labels of the configured shape: for smoke runs and benchmarks only."""
  cfg = data_config.synthetic
  shape = tuple(int(d) for d in cfg.image_shape)
  if len(shape) != 3 or min(shape) < 1:
    raise ValueError(f"data.synthetic.image_shape must be (height, width, channels), got {shape}")
  rng = np.random.default_rng(1234)

  def make(n):
    images = rng.integers(0, 256, size=(n,) + shape, dtype=np.uint8)
    labels = rng.integers(0, cfg.num_classes, size=(n,), dtype=np.int64)
    return images, labels

  return from_arrays("synthetic", make(cfg.train_examples), make(cfg.eval_examples),
                     num_classes=cfg.num_classes, max_value=255.0)


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
                                f"({type(e).__name__}: {first_line(e)}); {how}") from None
    features = builder.info.features
    if "image" not in features or "label" not in features:
      raise ValueError(f"tfds dataset '{tfds_name}' has no 'image'/'label' features (it has {list(features)})")

    def split(name):
      ds = builder.as_dataset(split=name, as_supervised=False, shuffle_files=False)
      ds = ds.map(lambda ex: (ex["image"], ex["label"]), num_parallel_calls=tf.data.AUTOTUNE)
      size = int(ds.cardinality().numpy())
      if size < 0:
        size = int(ds.reduce(0, lambda n, _: n + 1).numpy())
      return ds, size

    train, train_size = split(data_config.train_split)
    evaluation, eval_size = split(data_config.eval_split)
    if data_config.in_memory:  # whole splits in memory: exact per-epoch shuffles and resume.
      return from_arrays(tfds_name, _to_numpy(train), _to_numpy(evaluation),
                         num_classes=features["label"].num_classes, max_value=255.0)
    return Source(
        name=tfds_name, train=train, eval=evaluation, train_size=train_size, eval_size=eval_size,
        num_classes=features["label"].num_classes, image_shape=tuple(features["image"].shape),
        max_value=255.0)

  return load


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
CORRUPT_IMAGE_POLICIES = ("fail", "skip")


def image_folder(data_config):
  """Images in data_dir/<split>/<class name>/*.{png,jpg,jpeg,gif,bmp,webp}, decoded once into memory.

  Classes are the sorted sub-directories of the train split. Every image is decoded (and resized to
  data.image_size when set); an unreadable or corrupt file stops the load naming it (data.corrupt_images=fail)
  or is left out and counted (skip).
  """
  root, policy = data_config.data_dir, data_config.corrupt_images
  if policy not in CORRUPT_IMAGE_POLICIES:
    raise ValueError(f"data.corrupt_images must be one of {', '.join(CORRUPT_IMAGE_POLICIES)}, got '{policy}'")
  if not root:
    raise ValueError("data.name='image_folder' needs data.data_dir=ROOT holding ROOT/<split>/<class>/<images>")
  train_dir = os.path.join(root, data_config.train_split)
  if not os.path.isdir(train_dir):
    raise FileNotFoundError(f"image folder '{train_dir}' does not exist (expected ROOT/<split>/<class>/<images> "
                            f"with ROOT=data.data_dir and split=data.train_split)")
  classes = sorted(d for d in os.listdir(train_dir) if os.path.isdir(os.path.join(train_dir, d)))
  if not classes:
    raise ValueError(f"image folder '{train_dir}' has no class sub-directories")
  first = _image_files(train_dir, classes)[:1]
  channels = int(tf.io.decode_image(tf.io.read_file(first[0][0]), expand_animations=False).shape[-1]) if first else 3
  splits = [_decode_folder(os.path.join(root, split), classes, channels, data_config.image_size, policy)
            for split in (data_config.train_split, data_config.eval_split)]
  return from_arrays(f"image_folder:{root}", *splits, num_classes=len(classes), max_value=255.0)


def _image_files(split_dir, classes):
  files = []
  for label, name in enumerate(classes):
    directory = os.path.join(split_dir, name)
    if os.path.isdir(directory):
      files += [(os.path.join(directory, f), label) for f in sorted(os.listdir(directory))
                if f.lower().endswith(IMAGE_SUFFIXES)]
  return files


def _decode_folder(split_dir, classes, channels, size, policy):
  if not os.path.isdir(split_dir):
    raise FileNotFoundError(f"image folder '{split_dir}' does not exist")
  folders = {d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d))}
  unknown = sorted(folders - set(classes))
  if unknown:
    raise ValueError(f"'{split_dir}' has class folders that the train split lacks: {', '.join(unknown[:5])}")
  images, labels, skipped = [], [], []
  for path, label in _image_files(split_dir, classes):
    try:
      image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.PermissionDeniedError) as e:
      reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\].*$", "", e.message).strip()
      if policy == "fail":
        raise ValueError(f"image {path} is unreadable or corrupt ({reason}); set data.corrupt_images=skip to "
                         f"leave such files out (valid: {', '.join(CORRUPT_IMAGE_POLICIES)})") from None
      skipped.append(path)
      continue
    if size:
      image = tf.cast(tf.round(tf.image.resize(image, (size, size))), tf.uint8)
    elif images and image.shape != images[0].shape:
      raise ValueError(f"images differ in size ({path} is {image.shape[:2]}, {images[0].shape[:2]} before): "
                       f"set data.image_size to resize them all")
    images.append(image.numpy())
    labels.append(label)
  if skipped:
    logging.warning("skipped %d unreadable or corrupt image(s) in %s (data.corrupt_images=skip): %s%s",
                    len(skipped), split_dir, ", ".join(skipped[:3]), ", ..." if len(skipped) > 3 else "")
  if not images:
    return np.zeros((0, 1, 1, channels), np.uint8), np.zeros((0,), np.int64)
  return np.stack(images), np.array(labels, np.int64)


SOURCES = {
    "digits": digits,
    "synthetic": synthetic,
    "mnist": tfds_source("mnist"),
    "fashion_mnist": tfds_source("fashion_mnist"),
    "cifar10": tfds_source("cifar10"),
    "cifar100": tfds_source("cifar100"),
    "quickdraw_bitmap": tfds_source("quickdraw_bitmap"),
    "image_folder": image_folder,
}
TFDS_PREFIX = "tfds:"


def load(data_config):
  """Returns the Source named by data_config.name (a registry name or "tfds:<any tfds name>")."""
  name = data_config.name
  if name.startswith(TFDS_PREFIX):
    source = tfds_source(name[len(TFDS_PREFIX):])(data_config)
  elif name in SOURCES:
    source = SOURCES[name](data_config)
  else:
    raise unknown_name("dataset", name, list(SOURCES) + [TFDS_PREFIX + "<tfds name>"])
  if source.train_size == 0 or source.eval_size == 0:
    raise ValueError(f"dataset '{name}' is empty: {source.train_size} train and {source.eval_size} eval examples")
  return source


def _to_numpy(ds):
  images, labels = [], []
  for x, y in ds.batch(4096).as_numpy_iterator():
    images.append(x)
    labels.append(y)
  if not labels:
    return np.zeros((0,), np.uint8), np.zeros((0,), np.int64)
  return np.concatenate(images), np.concatenate(labels).astype(np.int64)
