"""Tasks: what a run trains (loops/task/interface.py is the contract; classification.py the built-in)."""

import numpy as np
import tensorflow as tf

from errors import ConfigError
from loops.core import plugins
from loops.task.context import StepContext
from loops.task.interface import BuildContext, Task

from loops.task import update_every
from loops.task.checks import BUILT_IN, check_task_settings


def load(config, loss_fn, metrics):
  """The run's task: the built-in classification (loss_fn and metrics from the config), or task.name's class
  built with task.kwargs. Checked by loops/check.py's check_task_name first."""
  cls = task_class(config.task.name)
  if config.task.name == BUILT_IN:
    task = cls(loss_fn, metrics)
  else:
    kwargs = dict(config.task.kwargs)
    plugins.check_call(cls, (), kwargs, "task.kwargs", config.task.name)
    task = cls(**kwargs)
  task.config = config
  return task


def task_class(name):
  """The Task subclass task.name names (the built-in's for "classification"): imported, not built."""
  if name == BUILT_IN:
    from loops.task import classification  # the built-in depends on loops/model; keep the contract importable alone
    return classification.ImageClassification
  cls = plugins.load(name, "task.name")
  if not (isinstance(cls, type) and issubclass(cls, Task)):
    raise ConfigError(f"task.name '{name}' is not a subclass of loops.task.Task")
  return cls


def update_span(config):
  """Steps after which the updates of task.name's Task.update_every repeat (the least common multiple of its
  periods, 1 for none), from the class (checked first: one line for a bad task.name or update_every)."""
  check_task_settings(config)
  return update_every.span(task_class(config.task.name).update_every)


def zero_batch(element_spec, batch):
  """A (features, targets) batch of zeros shaped like `batch` examples of element_spec."""
  return tf.nest.map_structure(lambda s: tf.zeros([batch] + list(s.shape), s.dtype), element_spec)


def eval_names(task, models, element_spec, global_batch_size, metrics, batch=2):
  """The names the task's eval_step returns, by running it once eagerly on a zero batch (before anything is
  written); raises ConfigError unless it returns {name: per-example values [batch]}."""
  ctx = StepContext(global_batch_size, tf.constant(0, tf.int64), training=False, metrics=metrics,
                    weights=tf.zeros([batch]))
  try:
    values = task.eval_step(zero_batch(element_spec, batch), models, ctx)
  except ConfigError:
    raise
  except Exception as e:  # a user's code: one line naming where
    raise ConfigError(f"{type(task).__name__}.eval_step failed on a zero batch of {batch}: "
                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
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
    if name in collected and shape[:1] == (batch,):
      continue  # gathered whole: one row per example, any shape
    if shape != (batch,):
      raise ConfigError(f"{type(task).__name__}.eval_step value '{name}' has shape {list(shape)}; expected one "
                        f"value per example, shape [{batch}] (the framework takes the weighted mean)")
  for name, metric in metrics.items():  # the probe must leave no trace in the task's metrics
    shape = tuple(np.shape(metric.result()))
    metric.reset_state()
    if shape:
      raise ConfigError(f"{type(task).__name__}.build_metrics: metric '{name}' ({type(metric).__name__}) gives "
                        f"shape {list(shape)}; an eval metric is one number (e.g. F1Score(average='macro'), or one "
                        f"metric per class)")
  return [name for name in values if name not in collected]
