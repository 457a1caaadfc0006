"""Where the two sides of a replica check part: at the first step that differs, the inputs of a model or the first
layer whose output differs beyond rounding, else the per-example loss (or a step's returned loss), else the
gradients.

Each side is built again, takes the steps before that one on its own (to reach its batch) and that one from the
check's start, with every Keras layer call recording its outputs (a `tf.py_function` beside each output, traced into
the step; the rows put back in the order one device reads them), every model of the task its inputs, and the task's
loss its value. A third build, the check's floor run (in float64, or its weights moved by one rounding), is what each
is judged against (loops/rounding.py). The first that differs, in the order one device computes them, is named with
what it is: a model's inputs (the step changed the batch before the model), a BatchNormalization with per-replica
statistics, a layer drawing random values (random ops traced inside it) that are not keyed per example, or a layer
reducing over the replica's rows.
"""

import dataclasses
import inspect
import os
import threading

import keras
import numpy as np
import tensorflow as tf

from loops import private_apis
from loops import rounding
from loops.modeling import random_layers

INPUTS = " inputs"
LOSS = "the per-example loss"
STEP_LOSS = "the loss the step returns"
RANDOM_OPS = ("Random", "Multinomial", "TruncatedNormal", "ParameterizedTruncatedNormal")


@dataclasses.dataclass(frozen=True)
class Finding:
  """What differs first: a layer (path, class, what it is), the loss, or nothing before the gradients."""
  kind: str  # "inputs", "batchnorm", "random", "layer", "loss", "gradients"
  where: str  # the layer's path in the build that recorded it, or what else differs
  place: str = ""  # the layer's place in the models (first_difference.places)
  difference: float = 0.0
  explained: float = 0.0


class Recorder:
  """Inside: every Keras layer called in a step being traced records its outputs' values when the step runs (the
  last run's stay), by (name, replica, micro-batch). A layer's name is its place in the models (Keras numbers layer
  paths per process: two builds' paths differ), '#2' on for its second call in the same step; `shown` maps names to
  paths.
  models: {name: keras model} of the build."""

  def __init__(self, models=None):
    self.values, self.order, self.layers, self.random, self.shown, self.unordered = {}, [], {}, {}, {}, set()
    self._places = {id(layer): place for place, layer in places(models or {}).items()}
    self._calls, self._lock, self._original = {}, threading.Lock(), None

  def __enter__(self):
    self._original = keras.layers.Layer.__call__
    original, recorder = self._original, self

    def recording_call(layer, *args, **kwargs):
      ctx = random_layers.active_context()
      if ctx is None or not tf.inside_function():
        return original(layer, *args, **kwargs)
      place = recorder._places.get(id(layer), "")
      if place.endswith(":0") and args:  # a model of the task: what it is given, before its layers
        recorder.add(recorder.named(place + INPUTS, f"the inputs of {layer.path or layer.name}"), args[0], ctx)
      graph = tf.compat.v1.get_default_graph()
      before = len(graph.get_operations())
      outputs = original(layer, *args, **kwargs)
      drawn = any(op.type.startswith(RANDOM_OPS) or op.type.startswith("StatelessRandom")
                  for op in graph.get_operations()[before:])
      recorder.add(recorder.named(layer), outputs, ctx, layer, drawn)
      return outputs

    keras.layers.Layer.__call__ = recording_call
    return self

  def __exit__(self, *exc):
    keras.layers.Layer.__call__ = self._original

  def named(self, thing, shown=None):
    """The layer's place (or a name), '#n' on its n-th call in this trace of this replica; shown: what a finding
    says (default: the layer's path)."""
    shown = shown or (thing if isinstance(thing, str) else (getattr(thing, "path", None) or thing.name))
    place = thing if isinstance(thing, str) else self._places.get(id(thing), shown)
    key = (threading.get_ident(), place)
    self._calls[key] = self._calls.get(key, 0) + 1
    name = place if self._calls[key] == 1 else f"{place}#{self._calls[key]}"
    self.shown[name] = shown if self._calls[key] == 1 else f"{shown} (call {self._calls[key]})"
    return name

  def add(self, name, outputs, ctx, layer=None, drawn=False):
    """Records each output tensor with the rows it holds (one device's order) when the step runs."""
    if name not in self.layers:
      self.order.append(name)
      self.layers[name], self.random[name] = layer, drawn
    for n, tensor in enumerate(t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)):
      if not (tensor.dtype.is_floating or tensor.dtype.is_integer):
        continue
      rows = tf.cast(ctx.replica_id, tf.int32)[None]  # a scalar: the replica's share
      if tensor.shape.rank and tensor.shape[0] not in (None, *ctx._batch_rows()):  # pylint: disable=protected-access
        self.unordered.add(f"{name}:{n}")  # not one batch's rows (views concatenated): matched row by row
      elif tensor.shape.rank:
        rows = ctx._rows_as_one_device_reads(tf.shape(tensor)[0])  # pylint: disable=protected-access
      micro = tf.cast(ctx.micro_batch[0], tf.int32)  # gradient accumulation runs a layer once per micro-batch
      tf.py_function(self._store(name, n), [tensor, rows, ctx.replica_id, micro], [])

  def _store(self, name, n):
    def store(value, rows, replica, micro):
      with self._lock:
        value = value.numpy()
        self.values[(name, n, int(replica.numpy()), int(micro.numpy()))] = (
            rows.numpy(), value.astype(np.float32, copy=False))
    return store

  def assembled(self, name, like=None):
    """The values recorded under `name`: every replica's rows in one device's order (a layer's outputs one after
    the other, flat), or None. like: the other side's Recorder, whose rows those of an output that is not one
    batch's (self.unordered: views concatenated) are matched to, one to one (None when too many to match)."""
    arrays = self._arrays(name)
    theirs = like._arrays(name) if like is not None else {}
    for n, array in arrays.items():
      if f"{name}:{n}" in self.unordered and n in theirs:
        arrays[n] = matched(array, theirs[n])
    if any(array is None for array in arrays.values()):
      return None
    return np.concatenate([arrays[n].ravel() for n in sorted(arrays)]).astype(np.float64) if arrays else None

  def _arrays(self, name):
    """{output index: its values, rows first where they have rows}."""
    parts = {}
    for (recorded, n, replica, micro), (rows, value) in self.values.items():
      if recorded == name:
        parts.setdefault(n, []).append(((replica, micro), rows, value))
    arrays = {}
    for n in sorted(parts):
      pieces = [(rows, value) for _, rows, value in sorted(parts[n], key=lambda piece: piece[0])]
      if all(value.ndim == 0 for _, value in pieces):  # shares of a scalar: their sum is one device's
        arrays[n] = np.array([sum(float(value) for _, value in pieces)])
      elif any(value.ndim == 0 or len(rows) != value.shape[0] for rows, value in pieces):
        arrays[n] = np.concatenate([value.reshape((-1,) + value.shape[1:]) for _, value in pieces])
      else:  # in one device's order (a layer called once per micro-batch holds that micro-batch's rows only)
        rows = np.concatenate([rows for rows, _ in pieces])
        arrays[n] = np.concatenate([value for _, value in pieces])[np.argsort(rows, kind="stable")]
    return arrays


MATCHED = 4e8  # rows x rows x features at most compared to match rows (a few seconds)


def matched(array, target):
  """array's rows put in the order that matches target's best, one to one (least squared distance), or None when
  there are too many to match; array itself when the shapes differ."""
  if array.shape != target.shape or array.ndim < 1:
    return array
  rows = len(array)
  mine, theirs = array.reshape(rows, -1).astype(np.float64), target.reshape(rows, -1).astype(np.float64)
  if rows * rows * mine.shape[1] > MATCHED:
    return None
  cost = (np.square(theirs).sum(1)[:, None] + np.square(mine).sum(1)[None]) - 2 * theirs @ mine.T
  import scipy.optimize  # pylint: disable=import-outside-toplevel  # 0.3 s of every process's start, used here only
  _, order = scipy.optimize.linear_sum_assignment(cost)
  return array[order]


def places(models):
  """{place: layer} of every model and layer of {name: keras model}: the same in every build of a config."""
  return {f"{name}:{i}": layer for name, model in models.items()
          for i, layer in enumerate([model] + private_apis.all_layers(model, include_self=False))}


def recorded(side_of, step, start, nudge=0.0):
  """(Recorder, the task) of step `step` (1-based) of the side built by side_of(): the steps before it on its own
  (their batches), that one from `start` (nudged)."""
  side = side_of()
  task = side.parts.task
  with Recorder(side.parts.models) as recorder:
    _record_the_loss(task, recorder)
    side.advance(step - 1)
    side.step(start, nudge)
  return recorder, task


def _record_the_loss(task, recorder):
  """The task's per-example loss (or its train_step's returned loss) recorded too (an instance attribute)."""
  method = "train_step" if task.writes_step else "per_example_loss"
  name = STEP_LOSS if task.writes_step else LOSS
  bound = getattr(task, method)

  def recording(*args, **kwargs):
    value = bound(*args, **kwargs)
    recorder.add(recorder.named(name), value, random_layers.active_context() or args[-1])
    return value

  setattr(task, method, recording)


def first(one, two, floor, minimum, margin=rounding.MARGIN):
  """The Finding of the first recorded layer (one's order) whose values differ beyond margin x the floor's, else
  of the loss, else "gradients"."""
  is_loss = lambda name: name.startswith((LOSS, STEP_LOSS))
  for name in [name for name in one.order if not is_loss(name)] + [name for name in one.order if is_loss(name)]:
    finding = _judged(name, one, two, floor, minimum, margin, "loss" if is_loss(name) else None)
    if finding:
      return finding
  return Finding("gradients", "")


def _judged(name, one, two, floor, minimum, margin, kind=None):
  a, b, c = one.assembled(name), two.assembled(name, like=one), floor.assembled(name)
  if a is None or b is None or a.shape != b.shape:
    return None
  scale = np.sqrt(np.mean(np.square(a))) or 1.0
  difference = float(np.sqrt(np.mean(np.square(a - b))) / scale)
  floor_value = float(np.sqrt(np.mean(np.square(a - c))) / scale) if c is not None and c.shape == a.shape else 0.0
  explained = margin * max(floor_value, minimum)
  if difference <= explained:
    return None
  layer = one.layers.get(name)
  if kind is None:
    if name.split("#")[0].endswith(INPUTS):
      kind = "inputs"
    elif isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized:
      kind = "batchnorm"
    elif one.random.get(name):
      kind = "random"
    else:
      kind = "layer"
  return Finding(kind, one.shown.get(name, name), place=name, difference=difference, explained=explained)


def loss_source(task, loss_name, task_name):
  """Where the loss is written: the loss function `loss_name` (loss.name, for the built-in classification, task.name
  `task_name`) or the task's method, with its file and line."""
  if task.writes_step:
    return _source(type(task).train_step, f"{type(task).__name__}.train_step")
  if loss_name and task_name == "classification":
    return f"the loss {loss_name}"
  return _source(type(task).per_example_loss, f"{type(task).__name__}.per_example_loss")


def _source(function, name):
  try:
    path = os.path.abspath(inspect.getsourcefile(function))
    shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
    return f"{name} ({shown}:{inspect.getsourcelines(function)[1]})"
  except (OSError, TypeError):
    return name


LAYER_KINDS = {
    "batchnorm": "BatchNormalization normalizing with each replica's own batch statistics (a difference by design, "
                 "not a bug)",
    "random": ("it draws random values that are not keyed per example (one device and 2 replicas draw other values "
               "for the same example); draw with ctx.normal or ctx.keyed_draws, or use the keyed Dropout family"),
    "layer": "the layer computes over the replica's own rows (a reduction over the batch axis inside it)",
}


def described(finding, task, loss_name, task_name, step, nudged=False):
  """The sentence a FAIL names for a Finding (loss_name, task_name: loss.name and task.name; nudged: the floor was
  the nudged one, not float64, so differing gradients may also be rounding it does not measure)."""
  at = f"at step {step}"
  if finding.kind in LAYER_KINDS:
    return f"the sides part first at {finding.where} {at}: {LAYER_KINDS[finding.kind]}"
  if finding.kind == "inputs":
    return (f"{finding.where} differ {at}, before any of its layers: the step changes the batch before the model "
            f"for the replica's rows (noise or augmentation not keyed per example: draw with ctx.normal or "
            f"ctx.keyed_draws)")
  if finding.kind == "loss":
    source = loss_source(task, loss_name, task_name)
    return (f"every layer's output agrees {at}; {finding.where} differs: {source} reduces over "
            f"the replica's own rows (see loops/task/context.py: ctx.average, ctx.all_gather, ctx.sum_over_replicas)")
  sentence = (f"every layer's output and the loss agree {at}; the gradients differ: the step changes them before "
              f"the cross-replica sum (clipping or normalizing the replica's gradients, SAM's epsilon from them)")
  if nudged:  # the sums of the gradients round by the batch's split; moving the weights may not show that
    sentence += (", or it is rounding of the gradients' sums that the nudged floor does not measure (the step does "
                 "not run in float64, where the floor is exact)")
  return sentence
