"""init.checkpoint: a new run's weights from another run's checkpoint or a Keras file (warm start, fine-tuning).
The warm-start reader of the checkpoints' owner: only loops/persist/checkpoints.py imports it.

Variables are matched by their place in the model (the path TensorFlow's checkpoints use, e.g.
`_functional/_operations/5/_kernel`, the same for a model rebuilt in any process whatever its layers are called)
and by shape; `init.exclude` leaves out variables by their Keras path. Sources:

  * a workdir (its latest checkpoint) or a checkpoint prefix: read with tf.train.load_checkpoint, its object graph
    walked from `model` (and `optimizer` for init.optimizer_state);
  * a .keras file: loaded with keras.models.load_model (copied to a local temporary file when remote);
  * a .weights.h5 file, or a Keras 2 style .h5 / .hdf5 (a whole model or its weights): loaded into a twin of this
    run's model (its variables set to NaN first, so what the file did not fill, missing or of another shape, is
    known).
"""

import contextlib
import dataclasses
import os
import posixpath
import re
import shutil
import tempfile
import zipfile

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from errors import ConfigError, described, first_line
from loops import private_apis
from loops.modeling.freeze import compact

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
SOURCES = "a workdir, a checkpoint prefix (.../checkpoints/ckpt-N), a .keras file or a .weights.h5 (or .h5) file"
H5_SUFFIXES = (".h5", ".hdf5")  # .weights.h5 (Keras 3) and Keras 2's .h5 files of a model or its weights


@dataclasses.dataclass
class Offered:
  """What a source offers: arrays by place in the model, their readable names, optimizer slots by (slot, place)."""
  description: str
  arrays: dict
  names: dict
  slots: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Match:
  """The table: target variable paths loaded, skipped (shape differs), excluded, not in the checkpoint; source
  names not in the model; scalars loaded of the model's total."""
  loaded: list
  skipped: list
  excluded: list
  missing: list
  unused: list
  loaded_scalars: int
  total_scalars: int

  @property
  def fraction(self):
    return self.loaded_scalars / max(self.total_scalars, 1)

  def counts(self):
    return {"init/loaded": len(self.loaded), "init/skipped_shape": len(self.skipped),
            "init/excluded": len(self.excluded), "init/not_in_checkpoint": len(self.missing),
            "init/not_in_model": len(self.unused), "init/loaded_fraction": round(self.fraction, 6)}


def places(root):
  """{place: object} for every trackable under `root`, by breadth-first first path (as checkpoints name them)."""
  found, queue, seen = {}, [("", root)], {id(root)}
  while queue:
    path, obj = queue.pop(0)
    for name, child in tf.train.TrackableView(obj).children(obj).items():
      if id(child) in seen:
        continue
      seen.add(id(child))
      place = f"{path}/{name}" if path else name
      found[place] = child
      queue.append((place, child))
  return found


def model_variables(model):
  """{place: Keras variable} of `model` (every variable, trainable or not)."""
  by_id = {id(v): v for v in model.weights}
  for v in model.weights:  # under a strategy the graph may hold the wrapped tf.Variable
    by_id.setdefault(id(getattr(v, "value", v)), v)
  return {place: by_id[id(obj)] for place, obj in places(model).items() if id(obj) in by_id}


def resolve_prefix(path):
  """The checkpoint prefix behind a workdir, a checkpoints directory or a prefix; ConfigError if there is none."""
  if tf.io.gfile.isdir(path):
    for directory in (posixpath.join(path, "checkpoints"), path):
      if tf.io.gfile.isdir(directory) and tf.train.latest_checkpoint(directory):
        return tf.train.latest_checkpoint(directory)
    raise ConfigError(f"init.checkpoint '{path}' is a directory without checkpoints; give {SOURCES}")
  if tf.io.gfile.exists(path + ".index"):
    return path
  raise ConfigError(f"init.checkpoint '{path}' does not exist; give {SOURCES}")


def read(path, twin, slots=False):
  """The Offered weights at `path`; `twin()` builds a fresh copy of this run's model (for .h5 files); the
  optimizer's slots of a checkpoint only with `slots` (init.optimizer_state)."""
  if path.endswith(".keras") or path.endswith(H5_SUFFIXES):
    if not tf.io.gfile.exists(path):
      raise ConfigError(f"init.checkpoint '{path}' does not exist; give {SOURCES}")
    with _local_copy(path) as local:
      if path.endswith(".keras") and not zipfile.is_zipfile(local):
        raise ConfigError(f"init.checkpoint '{path}' is not a valid .keras file (not the zip archive "
                          f"keras.Model.save writes); give {SOURCES}")
      try:
        return _from_keras_file(path, local) if path.endswith(".keras") else _from_weights_file(path, local, twin)
      except (ValueError, TypeError, OSError, KeyError) as e:
        raise ConfigError(f"init.checkpoint '{path}' cannot be read: {first_line(e)}") from None
  return _from_checkpoint(resolve_prefix(path), slots)


@contextlib.contextmanager
def _local_copy(path):
  """A local path for `path`: itself when local, else a temporary copy through tf.io.gfile (removed after)."""
  if "://" not in path:
    yield path
    return
  directory = tempfile.mkdtemp(prefix="init-checkpoint-")
  try:
    local = os.path.join(directory, posixpath.basename(path))
    tf.io.gfile.copy(path, local, overwrite=True)
    yield local
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def _from_keras_file(path, local):
  model = keras.models.load_model(local, compile=False)
  variables = model_variables(model)
  return Offered(f"{path} (Keras model)", {p: v.numpy() for p, v in variables.items()},
                {p: v.path for p, v in variables.items()})


def _from_weights_file(path, local, twin):
  model = twin()
  for v in model.weights:
    if v.dtype.startswith("float"):
      v.assign(np.full(v.shape, np.nan, v.dtype))
  model.load_weights(local, skip_mismatch=True)
  variables = {p: v for p, v in model_variables(model).items() if v.dtype.startswith("float")}
  arrays = {p: v.numpy() for p, v in variables.items()}
  arrays = {p: a for p, a in arrays.items() if not np.isnan(a).all()}
  return Offered(f"{path} (Keras weights)", arrays, {p: variables[p].path for p in arrays})


def _from_checkpoint(prefix, slots=False):
  try:
    return _read_checkpoint(prefix, slots)
  except (tf.errors.OpError, IndexError) as e:  # torn or truncated (as checkpoints.unreadable: TF raises both)
    raise ConfigError(f"init.checkpoint '{prefix}' cannot be read ({described(e)}); give an "
                      "intact checkpoint (a workdir's best/ or an earlier ckpt-N)") from None


def _read_checkpoint(prefix, slots):
  reader = tf.train.load_checkpoint(prefix)
  if not reader.has_tensor(OBJECT_GRAPH):
    raise ConfigError(f"init.checkpoint '{prefix}' has no object graph (a TF1 name-based checkpoint?); give "
                      f"{SOURCES}")
  graph = private_apis.trackable_object_graph()
  graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH))
  root = {child.local_name: child.node_id for child in graph.nodes[0].children}
  if "model" not in root:
    raise ConfigError(f"init.checkpoint '{prefix}' holds no 'model' (not written by this framework?); give "
                      f"{SOURCES}")
  node_places = _node_places(graph, root["model"])
  keys = {place: _value_key(graph.nodes[node]) for node, place in node_places.items()}
  arrays = {place: reader.get_tensor(key) for place, key in keys.items() if key}
  source = Offered(prefix, arrays, {place: place for place in arrays})
  if slots and "optimizer" in root:
    source.slots = _slots(graph, reader, root["optimizer"], node_places)
  return source


def _node_places(graph, top):
  """{node id: place under `top`} by breadth-first first path (the order places() walks a live model)."""
  found, queue = {top: ""}, [top]
  while queue:
    node = queue.pop(0)
    for child in graph.nodes[node].children:
      if child.node_id not in found:
        found[child.node_id] = f"{found[node]}/{child.local_name}" if found[node] else child.local_name
        queue.append(child.node_id)
  del found[top]
  return found


def _value_key(node):
  return next((a.checkpoint_key for a in node.attributes if a.name == "VARIABLE_VALUE"), None)


# An optimizer's lists that are not per-variable state (Keras 3 names Adam's `_momentums`/`_velocities`, SGD's
# `momentums`: the state lists are told by name from these, not by a leading underscore).
NOT_SLOT_LISTS = ("_trainable_variables", "_variables")


def _slots(graph, reader, optimizer_node, node_places):
  """{(slot list name, model place): array}: the optimizer's per-variable lists aligned with its
  `_trainable_variables` (momentums, velocities, ...)."""
  children = {c.local_name: c.node_id for c in graph.nodes[optimizer_node].children}
  if "_trainable_variables" not in children:
    return {}
  owners = [node_places.get(c.node_id) for c in graph.nodes[children["_trainable_variables"]].children]
  slots = {}
  for name, node in children.items():
    items = graph.nodes[node].children
    if name in NOT_SLOT_LISTS or len(items) != len(owners):
      continue
    for owner, item in zip(owners, items):
      key = _value_key(graph.nodes[item.node_id])
      if owner and key:
        slots[(name, owner)] = reader.get_tensor(key)
  return slots


def match(source, variables, exclude):
  """Match (the table) of `variables` ({place: Keras variable}) against `source`."""
  loaded, skipped, excluded, missing, scalars = [], [], [], [], 0
  for place, variable in variables.items():
    if any(re.search(pattern, variable.path) for pattern in exclude):
      excluded.append(variable.path)
    elif place not in source.arrays:
      missing.append(variable.path)
    elif tuple(source.arrays[place].shape) != tuple(variable.shape):
      skipped.append(f"{variable.path} {list(source.arrays[place].shape)}->{list(variable.shape)}")
    else:
      loaded.append(variable.path)
      scalars += int(np.prod(variable.shape))
  unused = [source.names[place] for place in source.arrays if place not in variables]
  total = sum(int(np.prod(v.shape)) for v in variables.values())
  return Match(loaded, skipped, excluded, missing, unused, scalars, total)


def table(description, result):
  """The log lines: one row per category, its count and its names (compact)."""
  rows = [("loaded", result.loaded), ("skipped (shape differs)", result.skipped),
          ("excluded (init.exclude)", result.excluded), ("not in the checkpoint", result.missing),
          ("not in the model", result.unused)]
  lines = [f"init.checkpoint {description}: {result.loaded_scalars} of {result.total_scalars} scalars loaded "
           f"({100 * result.fraction:.1f}%)"]
  lines += [f"  {label:<24} {len(names):>5}  {compact(names, 8)}" for label, names in rows]
  return "\n".join(lines)


def inspect(init, model, twin):
  """(source, {place: variable}, Match) for init.checkpoint against `model`; nothing is assigned (--dry_run).

  Raises:
    ConfigError: a missing or unreadable source, or less than init.min_fraction of the model's scalars loadable.
  """
  source = read(init.checkpoint, twin, slots=init.optimizer_state)
  variables = model_variables(model)
  result = match(source, variables, tuple(init.exclude))
  if variables and len(result.excluded) == len(variables):
    raise ConfigError(f"init.exclude {tuple(init.exclude)} excludes all {len(variables)} weights of the model: "
                      f"init.checkpoint '{init.checkpoint}' would load nothing; exclude only what must start fresh "
                      f"(regular expressions searched in paths such as {compact(sorted(result.excluded), 2)})")
  for pattern in init.exclude:
    if not any(re.search(pattern, v.path) for v in variables.values()):
      logging.warning("init.exclude pattern '%s' matches no variable of the model (paths: %s)", pattern,
                      compact([v.path for v in variables.values()], 4))
  if result.fraction < init.min_fraction:
    raise ConfigError(
        f"init.checkpoint '{init.checkpoint}' would load {100 * result.fraction:.1f}% of the model's weights "
        f"({result.loaded_scalars} of {result.total_scalars} scalars; init.min_fraction={init.min_fraction}): "
        f"{len(result.skipped)} of another shape ({compact(result.skipped, 3)}), {len(result.missing)} not in "
        f"the checkpoint, {len(result.unused)} not in the model; check the path and model.name/model.kwargs, "
        f"or lower init.min_fraction")
  return source, variables, result


def warm_start(init, model, optimizer, strategy, twin):
  """Loads init.checkpoint into `model` (and, with init.optimizer_state, `optimizer`'s slots) under `strategy`.

  Returns:
    (the table's text, the counts for summary.json).

  Raises:
    ConfigError: as inspect (nothing is assigned then).
  """
  source, variables, result = inspect(init, model, twin)
  by_path = {v.path: place for place, v in variables.items()}
  with strategy.scope():
    for path in result.loaded:
      variables[by_path[path]].assign(source.arrays[by_path[path]])
    counts = result.counts()
    if init.optimizer_state:
      counts["init/optimizer_slots"] = _load_slots(source, optimizer, model, [by_path[p] for p in result.loaded])
  return table(source.description, result), counts


def _load_slots(source, optimizer, model, loaded_places):
  """Assigns the source's optimizer slots of the loaded variables where the slot exists here with the same shape;
  returns how many were taken."""
  if not source.slots:
    logging.warning("init.optimizer_state: %s holds no optimizer state; the optimizer starts fresh",
                    source.description)
    return 0
  owner_place = {id(v): place for place, v in model_variables(model).items()}
  trainables = [owner_place.get(id(v)) for v in private_apis.built_variables(optimizer)]
  taken, loaded = 0, set(loaded_places)
  for name, group in tf.train.TrackableView(optimizer).children(optimizer).items():
    items = list(tf.train.TrackableView(group).children(group).values())
    if name in NOT_SLOT_LISTS or len(items) != len(trainables):
      continue
    for owner, slot in zip(trainables, items):
      value = source.slots.get((name, owner))
      if owner in loaded and value is not None and tuple(value.shape) == tuple(slot.shape):
        slot.assign(value)
        taken += 1
  logging.info("init.optimizer_state: %d optimizer slot variable(s) taken from %s", taken, source.description)
  return taken
