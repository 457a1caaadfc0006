"""A user's arrays as a source: `data.name=package.module:function` (a function with a `context` parameter is an
input function: data/user_stream.py).

`function(split)` is called with "train" and "eval" and returns (features, targets): numpy arrays, or dicts of
them (any dtype and shape), every array with the split's examples on its first axis. The framework then treats
them like any in-memory source: a per-epoch order keyed on (seed, epoch), sharded before batching, skipped on
resume, eval padded with zero rows of weight 0 — so resume is exact and any replica or worker count sees the same
global batches. No image preprocessing is applied (data.image_size, mean/std, flips and mixing are refused).
"""


import numpy as np
import tensorflow as tf

from data import user_code
from data import user_stream
from data.loaded_source import Source
from errors import ConfigError


def is_user_function(name):
  return ":" in name and not name.startswith("tfds:")


def resolve(name):
  """The loader for data.name='package.module:function' or 'path/to/file.py:function' (ConfigError when it cannot
  be imported)."""
  fn = user_code.named(name, "data.name")
  if not callable(fn):
    raise ConfigError(f"data.name='{name}' names {type(fn).__name__}, not a function")
  if user_stream.is_input_function(fn):
    return lambda data_config: user_stream.load(name, fn)
  return lambda data_config: load(name, fn)


def load_streams(name, streams, eval_stream):
  """The Source of an input function read as a task's named streams ({name: multiple}); a source of another
  kind cannot be: ConfigError."""
  if not is_user_function(name):
    raise ConfigError(f"the task reads the streams {list(streams)}: data.name must be an input function "
                      f"'package.module:function' taking (split, *, stream, batch_size, context, seed, epoch), got "
                      f"'{name}'")
  resolve(name)  # the one-line import errors
  fn = user_code.named(name, "data.name")
  if not user_stream.is_input_function(fn):
    raise ConfigError(f"data.name='{name}': the task reads the streams {list(streams)}, so "
                      f"{name.rpartition(':')[2]} must be an input function (split, *, stream, batch_size, context, "
                      "seed, epoch), not arrays of one split")
  return user_stream.load(name, fn, streams, eval_stream)


def load(name, fn):
  train, evaluation = (_split(name, fn, split) for split in ("train", "eval"))
  for spec_train, spec_eval in zip(tf.nest.flatten(_spec(train)), tf.nest.flatten(_spec(evaluation))):
    if spec_train != spec_eval:
      raise ConfigError(f"data.name='{name}': the eval split's arrays {spec_eval} differ from the train split's "
                        f"{spec_train} (beyond the number of examples)")
  return Source(name=name, train=tf.data.Dataset.from_tensor_slices(train),
                eval=tf.data.Dataset.from_tensor_slices(evaluation), train_size=_size(train),
                eval_size=_size(evaluation), num_classes=0, image_shape=None, max_value=1.0, train_arrays=train)


def _split(name, fn, split):
  """(features, targets) of one split as numpy nests, checked: a pair, arrays, equal first axes."""
  value = fn(split)
  if not (isinstance(value, tuple) and len(value) == 2):
    raise ConfigError(f"data.name='{name}': {name.split(':')[1]}('{split}') must return (features, targets), "
                      f"got {type(value).__name__}")
  arrays = tf.nest.map_structure(np.asarray, value)
  for path, array in zip(_paths(arrays), tf.nest.flatten(arrays)):
    if array.dtype == object:
      raise ConfigError(f"data.name='{name}': {name.split(':')[1]}('{split}') returned {path} as Python objects "
                        f"(dtype object, e.g. rows of different lengths): give numbers or strings of one dtype and "
                        f"shape (pad rows to one length, or use an input function for sequences)")
  lengths = {a.shape[0] if a.ndim else None for a in tf.nest.flatten(arrays)}
  if len(lengths) != 1 or None in lengths:
    raise ConfigError(f"data.name='{name}': every array of split '{split}' needs the examples on its first axis, "
                      f"with the same count; got first axes {sorted(map(str, lengths))}")
  return arrays


def _paths(arrays):
  """'features', 'targets', "features['ids']" ...: the place of each array of a (features, targets) nest."""
  def named(prefix, value):
    if isinstance(value, dict):
      return [p for key, item in value.items() for p in named(f"{prefix}[{key!r}]", item)]
    return [prefix]
  return named("features", arrays[0]) + named("targets", arrays[1])


def _size(arrays):
  return int(tf.nest.flatten(arrays)[0].shape[0])


def _spec(arrays):
  return tf.nest.map_structure(lambda a: (a.dtype, a.shape[1:]), arrays)
