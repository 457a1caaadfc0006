"""The data settings' rules (loops/rules.py runs them in its stages, before anything is written): each setting on
its own (`check_settings`), then what needs the loaded source and the plan (`check_against_source`)."""

import re

from data import mixing
from data import resident
from data import sources
from data import tfrecord_features
from data import user_stream
from errors import ConfigError, at_least, one_of


def check_settings(d):
  """data.* on its own: the name resolves, values in range, the settings a source kind needs."""
  sources.resolve(d.name)
  one_of("data.corrupt_images", d.corrupt_images, sources.CORRUPT_IMAGE_POLICIES)
  one_of("data.device_resident", d.device_resident, resident.CHOICES)
  at_least("data.device_resident_max_bytes", d.device_resident_max_bytes, 0, "a number of bytes")
  if d.num_classes is not None:
    at_least("data.num_classes", d.num_classes, 1)
  if d.name == "npz":
    _check_npz_settings(d)
  if d.name == "image_folder" and not d.data_dir:
    raise ConfigError("data.name='image_folder' needs data.data_dir=ROOT holding ROOT/<split>/<class>/<images>")
  if d.name == "tfrecord":
    _check_tfrecord_settings(d)
  shape = tuple(d.synthetic.image_shape)
  if d.name == "synthetic" and (len(shape) != 3 or min(shape) < 1):
    raise ConfigError(f"data.synthetic.image_shape must be (height, width, channels), got {shape}")
  _check_image_settings(d)
  if d.pipeline_threads is not None:
    at_least("data.pipeline_threads", d.pipeline_threads, 0, "None (auto), 0 (tf.data's pool) or")
  at_least("data.shuffle_window", d.shuffle_window, 1)
  at_least("data.streams", d.streams, 1)
  if d.service and not d.service.startswith(("grpc://", "grpc+loas://")):
    raise ConfigError(f"data.service must be '' (off) or a dispatcher address grpc://HOST:PORT, got '{d.service}'")
  if not (isinstance(d.service_timeout_seconds, (int, float)) and d.service_timeout_seconds > 0):
    raise ConfigError(f"data.service_timeout_seconds must be a number of seconds > 0, got {d.service_timeout_seconds!r}")


def _check_image_settings(d):
  if d.image_size is not None:
    at_least("data.image_size", d.image_size, 1, "None (keep) or a number of pixels")
  if (d.mean is None) != (d.std is None) or (d.mean is not None and len(d.mean) != len(d.std)):
    raise ConfigError(f"data.mean and data.std must be set together with one value per channel (or both None), "
                      f"got {d.mean} and {d.std}")
  if d.std is not None and not all(s > 0 for s in d.std):
    raise ConfigError(f"data.std values must be > 0, got {d.std}")
  for name in ("mixup_alpha", "cutmix_alpha"):
    if not d[name] >= 0:
      raise ConfigError(f"data.{name} must be >= 0 (0 = off; typical 0.2 for mixup, 1.0 for cutmix), got {d[name]}")


def _check_tfrecord_settings(d):
  if not d.data_dir:
    raise ConfigError("data.name='tfrecord' needs data.data_dir: a directory written by `python -m data.prepare`, or "
                      "a glob of TFRecord files with {split} for the split name (e.g. /data/imagenet/{split}-*)")
  if d.tfrecord.features:  # a task's named features (data/tfrecord_features.py): the image settings do not apply
    tfrecord_features.parse_spec(d.tfrecord.features)
    return
  shape = d.tfrecord.image_shape
  if shape is not None and (len(shape) != 3 or min(shape) < 1):
    raise ConfigError(f"data.tfrecord.image_shape must be None or (height, width, channels), got {tuple(shape)}")
  if d.tfrecord.num_classes is not None:
    at_least("data.tfrecord.num_classes", d.tfrecord.num_classes, 1, "None (from the manifest) or")


def _check_npz_settings(data_config):
  """data.data_dir names an .npz file and both split names can be array-name suffixes."""
  if not (data_config.data_dir or "").endswith(".npz"):
    raise ConfigError(f"data.name='npz' needs data.data_dir=PATH.npz (a local or tf.io.gfile path of an .npz "
                      f"holding {sources.NPZ_KEYS}), got {data_config.data_dir!r}")
  for key in ("train_split", "eval_split"):
    if not re.fullmatch(r"\w+", data_config[key]):
      raise ConfigError(f"data.{key}='{data_config[key]}' cannot name an npz split: split S reads the arrays x_S "
                        f"and y_S (train, test, or any other suffix the file has)")


def check_against_source(d, plan, source, trains=True):
  """What needs the loaded source and the plan: a whole global batch per epoch (when the run trains), streams of
  record files, image settings only on images, one mean/std value per channel."""
  if source.train_files is not None and trains:
    _check_streams(d, plan, source)
  if plan.steps_per_epoch < 1 and trains:
    raise ConfigError(f"dataset '{source.name}' has {source.train_size} train examples: fewer than one global "
                      f"batch of {plan.global_batch_size}")
  for stream in source.streams or ():
    if user_stream.stream_steps(stream, plan.global_batch_size) < 1:
      raise ConfigError(f"stream '{stream.name}' of dataset '{source.name}' has {stream.size} train examples: "
                        f"fewer than its global batch of {plan.global_batch_size * stream.multiple} "
                        f"({stream.multiple} x {plan.global_batch_size})")
  if source.image_shape is None:
    _check_array_source(d, source)
    return
  channels, mean = source.image_shape[-1], d.mean
  if mean is not None and len(mean) != channels:
    raise ConfigError(f"data.mean and data.std need {channels} values (one per channel of dataset "
                      f"'{source.name}'), got {len(mean)}")


def _check_array_source(d, source):
  """A user's arrays are fed as they are: the image settings would silently do nothing."""
  for key, value in (("data.image_size", d.image_size), ("data.mean", d.mean), ("data.random_flip", d.random_flip),
                     ("data.mixup_alpha", d.mixup_alpha), ("data.cutmix_alpha", d.cutmix_alpha)):
    if value:
      raise ConfigError(f"{key}={value!r} is an image setting; dataset '{source.name}' is a user's arrays, fed as "
                        f"they are (preprocess them in your function, or unset {key})")


def _check_streams(data_config, plan, source):
  """Record files read as data.streams streams (data/records.py): whole shares per step, whole streams per
  worker, a file for every stream, and mixes of the whole global batch only where one pipeline reads it."""
  streams, files = data_config.streams, len(source.train_files.paths)
  if plan.global_batch_size % streams:
    raise ConfigError(f"data.streams={streams} must divide the global batch ({plan.global_batch_size}): each step "
                      f"takes the same number of records from every stream")
  if streams % plan.input_pipelines:
    raise ConfigError(f"data.streams={streams} must be a multiple of the {plan.input_pipelines} workers (each "
                      f"reads whole streams); e.g. {plan.input_pipelines * max(1, streams // plan.input_pipelines)}")
  if files < streams:
    raise ConfigError(f"dataset '{source.name}' has {files} train file(s), fewer than data.streams={streams}; "
                      f"set data.streams <= {files} or prepare more shards")
  if plan.input_pipelines > 1 and mixing.mixes(data_config):
    raise ConfigError("mixup/cutmix mix examples of the whole global batch, which no worker reads when streamed "
                      "record files are split over workers; hold the data in memory (data.in_memory=True) or "
                      "turn mixup/cutmix off")
