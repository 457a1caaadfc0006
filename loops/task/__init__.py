"""Tasks: what a run trains (loops/task/interface.py is the contract; classification.py the built-in)."""

import functools
import inspect
import re

import keras
import numpy as np
import tensorflow as tf

from errors import ConfigError, described
from loops import private_apis
from loops.core import plugins
from loops.task.context import StepContext
from loops.task.interface import BuildContext, Task

from loops.task import update_every
from loops.task.rules import BUILT_IN


def load(config, task_settings, loss_fn, metrics):
  """The run's task: the built-in classification (loss_fn and metrics from the config), or task.name's class
  built with task.kwargs (`task_settings`: the task settings; `config`: the bag, the task's `config` attribute).
  Checked by loops/task/rules.py's check_task_settings first."""
  cls = task_class(task_settings.name)
  if task_settings.name == BUILT_IN:
    task = cls(loss_fn, metrics)
  else:
    kwargs = dict(task_settings.kwargs)
    plugins.check_call(cls, (), kwargs, "task.kwargs", task_settings.name)
    task = cls(**kwargs)
    task.kwargs = kwargs
    if task.streams != cls.streams or task.eval_stream != cls.eval_stream:
      raise ConfigError(f"{cls.__name__} sets streams or eval_stream on the instance; set them on the class (the "
                        f"data is loaded per stream before the task is built)")
  task.config = config
  # built under the float64 dtype policy (the replica check's floor run): the batches' floats in float64 too
  task._batches_in_float64 = keras.mixed_precision.dtype_policy().compute_dtype == "float64"  # pylint: disable=protected-access
  return task


def task_class(name):
  """The Task subclass task.name names (the built-in's for "classification"): imported, not built."""
  if name == BUILT_IN:
    from loops.task import classification  # the built-in depends on loops/modeling; keep the contract importable alone
    return classification.ImageClassification
  cls = plugins.load(name, "task.name")
  if not (isinstance(cls, type) and issubclass(cls, Task)):
    raise ConfigError(f"task.name '{name}' is not a subclass of loops.task.Task")
  return cls


def update_span(task_name):
  """Steps after which the updates of task.name's Task.update_every repeat (the least common multiple of its
  periods, 1 for none), from the class (check_task_settings first: one line for a bad task.name or update_every)."""
  return update_every.span(task_class(task_name).update_every)


def streams_of(task_name):
  """(Task.streams, Task.eval_stream) of task.name's class ({}, None for the built-in): what data.load reads."""
  if task_name == BUILT_IN:
    return {}, None
  cls = task_class(task_name)
  return dict(cls.streams), cls.eval_stream


def _calling(fn, args, kwargs):
  return fn(*args, **kwargs)


@functools.cache
def _converted_calling():
  return tf.autograph.to_graph(_calling)


@tf.autograph.experimental.do_not_convert
def user_call(fn, *args, **kwargs):
  """fn(*args, **kwargs) with fn and what it calls converted by AutoGraph, as a tf.function converts its callees: a
  task's methods and its loss may branch and loop in Python on tensors. The framework's own step functions are not
  converted (that cost about 1 s of every run's start) and call the task through here. An error raised in it is
  re-raised as a tf.function raises it: "in user code:" and the user's file and line (errors.first_line)."""
  try:
    return _converted_calling()(fn, args, kwargs)
  except Exception as e:  # pylint: disable=broad-except  # re-raised as a tf.function would: naming the user's line
    raised = private_apis.autograph_user_error(e)
    if raised is e:
      raise
    raise raised  # pylint: disable=raise-missing-from  # its context is `e` (errors.config_error_within reads it)


@tf.autograph.experimental.do_not_convert
def stream_batch(task, features, targets):
  """The batch a task's step gets: (features, targets), or {stream: (features, targets)} for a task with streams
  (the pipeline's element is ({stream: features}, {stream: targets}))."""
  features, targets = _in_models_floats(task, (features, targets))
  if not task.streams:
    return features, targets
  return {name: (features[name], targets[name]) for name in task.streams}


@tf.autograph.experimental.do_not_convert
def eval_batch(task, features, targets):
  """The batch a task's eval step gets: {eval stream: (features, targets)} for a task with streams."""
  features, targets = _in_models_floats(task, (features, targets))
  if not task.streams:
    return features, targets
  return {task.eval_stream or next(iter(task.streams)): (features, targets)}


def _in_models_floats(task, batch):
  """The batch, its floating tensors in float64 for a task built under the float64 dtype policy: its models
  compute in float64, and a task's `predicted - targets` would otherwise meet float32 targets."""
  if not getattr(task, "_batches_in_float64", False):
    return batch
  return tf.nest.map_structure(lambda t: tf.cast(t, tf.float64) if t is not None and t.dtype.is_floating else t,
                               batch)


def serving_predict(task, models):
  """fn(features batch) -> task.predict_step's {name: outputs} for the export: the batch is (features, None) (no
  targets in serving; {eval stream: (features, None)} for a task with streams), ctx a StepContext in inference mode
  whose global batch is the served batch's."""

  def predict(features):
    rows = tf.shape(tf.nest.flatten(features)[0])[0]
    ctx = StepContext(rows, tf.constant(0, tf.int64), training=False, streams=task.streams)
    return task.predict_step(eval_batch(task, features, None), models, ctx)

  return predict


@tf.autograph.experimental.do_not_convert
def method_name(task, method):
  """'Class.method (file:line)' of a task's method, for an error that names where to look."""
  function = getattr(type(task), method)
  try:
    where = f" ({inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]})"
  except (OSError, TypeError):
    where = ""
  return f"{type(task).__name__}.{method}{where}"


@tf.autograph.experimental.do_not_convert
def checked_step_loss(task, loss):
  """A step-level train_step's return: this replica's share of the global loss, one number; else ConfigError."""
  if loss is None or isinstance(loss, (dict, list, tuple, str)):
    got = "None" if loss is None else f"a {type(loss).__name__}"
  else:
    shape = tf.convert_to_tensor(loss).shape
    if shape.rank == 0:
      return loss
    got = f"shape {shape.as_list() if shape.rank is not None else 'unknown'}"
  raise ConfigError(f"{method_name(task, 'train_step')} returned {got}; it must return this replica's share of the "
                    "global loss, one number (ctx.average(per_example))")


def checked_reduced(task, reduced):
  """reduce_eval's return as {name: float}: a dict of the eval_reduced names, each a real number; else ConfigError."""
  where = method_name(task, "reduce_eval")
  if not isinstance(reduced, dict) or set(reduced) != set(task.eval_reduced):
    got = sorted(reduced) if isinstance(reduced, dict) else type(reduced).__name__
    raise ConfigError(f"{where} returned {got}; eval_reduced declares {sorted(task.eval_reduced)}: return "
                      "{name: number} for each")
  numbers = {}
  for name, value in reduced.items():
    try:
      numbers[name] = float(np.asarray(value, np.float64).reshape(()))
    except (TypeError, ValueError):
      raise ConfigError(f"{where} value '{name}' is {type(value).__name__} {np.shape(value)}, not one number") from None
  return numbers


def reduce_eval(task, collected):
  """task.reduce_eval(collected) checked: {name: float}; a user's exception is one line naming the method."""
  try:
    reduced = task.reduce_eval(collected)
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f"{method_name(task, 'reduce_eval')} raised {described(e)}") from e
  return checked_reduced(task, reduced)


def _probe_reduce_eval(task, zero_rows):
  """reduce_eval on the zero batch's rows: what it returns must have the declared form (an exception there is not
  judged: zero rows may be degenerate data for it; the real eval names it)."""
  try:
    reduced = task.reduce_eval(zero_rows)
  except Exception:  # pylint: disable=broad-except
    return
  checked_reduced(task, reduced)


def zero_batch(element_spec, batch, length=1):
  """A (features, targets) batch of zeros shaped like `batch` examples of element_spec; a dimension of unknown
  size (a sequence padded per batch: [None]) gets `length`. ConfigError naming the spec when none can be built."""
  def zeros(spec):
    if spec.shape.rank is None:
      raise ValueError("its rank is unknown")
    return tf.zeros([batch] + [length if d is None else d for d in spec.shape.as_list()], spec.dtype)

  try:
    return tf.nest.map_structure(zeros, element_spec)
  except Exception as e:  # pylint: disable=broad-except  # any failure here is the probe's, not the task's
    raise ConfigError(f"the framework could not build a probe batch of zeros for the examples {element_spec} "
                      f"(not your eval_step): {described(e)}; "
                      "give every feature a known rank (tf.ensure_shape in the input function)") from e


def precision_hint(models, error):
  """What to do when a step met a model's float16/bfloat16 values beside float32 ones (mixed_precision), else ""."""
  mixed = sorted({model.compute_dtype for model in models.values()} & {"bfloat16", "float16"})
  if not mixed or not re.search(r"bfloat16|half|float16", str(error)):
    return ""
  return (f"; under mixed_precision the models compute in {mixed[0]}: cast a model's outputs to your targets' dtype "
          f"before mixing them (tf.cast(model(x), targets.dtype); docs/tasks.md)")


def eval_names(task, models, element_spec, global_batch_size, metrics, batch=2):
  """The names the task's eval_step returns, by running it once eagerly on a zero batch (before anything is
  written; sequences of unknown length are 1 long); raises ConfigError unless it returns {name: per-example values
  [batch]}."""
  ctx = StepContext(global_batch_size, tf.constant(0, tf.int64), training=False, metrics=metrics,
                    weights=tf.zeros([batch]), streams=task.streams)
  probe = eval_batch(task, *zero_batch(element_spec, batch))
  try:
    values = task.eval_step(probe, models, ctx)
  except ConfigError:
    raise
  except Exception as e:  # a user's code: one line naming where
    shapes = tf.nest.map_structure(lambda t: t.shape.as_list(), probe)
    raise ConfigError(f"{type(task).__name__}.eval_step failed on a zero batch of {batch} (shapes {shapes}): "
                      f"{described(e)}{precision_hint(models, e)}") from e
  if not isinstance(values, dict) or not values:
    raise ConfigError(f"{type(task).__name__}.eval_step must return {{name: per-example values}}, got "
                      f"{type(values).__name__}")
  collected = set(task.eval_collect)
  missing = sorted(collected - set(values))
  if missing:
    raise ConfigError(f"{type(task).__name__}.eval_collect names {missing}, which eval_step does not return "
                      f"(it returns {sorted(values)})")
  for name, value in values.items():
    shape = tuple(np.shape(value))
    if name in collected and tf.as_dtype(getattr(value, "dtype", np.asarray(value).dtype)) == tf.string:
      raise ConfigError(f"{type(task).__name__}.eval_step value '{name}' (eval_collect) holds strings, which are not "
                        "gathered across replicas and workers: collect numbers (e.g. ids) and look them up in "
                        "reduce_eval")
    if name in collected and shape[:1] == (batch,):
      continue  # gathered whole: one row per example, any shape
    if shape != (batch,):
      raise ConfigError(f"{type(task).__name__}.eval_step value '{name}' has shape {list(shape)}; expected one "
                        f"value per example, shape [{batch}] (the framework takes the weighted mean)")
  if collected:
    _probe_reduce_eval(task, {name: np.asarray(values[name]) for name in collected})
  for name, metric in metrics.items():  # the probe must leave no trace in the task's metrics
    shape = tuple(np.shape(metric.result()))
    metric.reset_state()
    if shape:
      raise ConfigError(f"{type(task).__name__}.build_metrics: metric '{name}' ({type(metric).__name__}) gives "
                        f"shape {list(shape)}; an eval metric is one number (e.g. F1Score(average='macro'), or one "
                        f"metric per class)")
  return [name for name in values if name not in collected]
