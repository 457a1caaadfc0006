"""The task's rules, checked before anything is written (loops/rules.py calls them in its stages)."""

import keras

from errors import ConfigError
from loops.core import plugins
from loops.task import update_every

BUILT_IN = "classification"


def check_task_settings(config):
  """task.name names the built-in or a Task subclass whose constructor takes task.kwargs; a step-level task
  refuses what only the loss level supplies."""
  name = config.task.name
  if name == BUILT_IN:
    if dict(config.task.kwargs):
      raise ConfigError(f"task.kwargs {dict(config.task.kwargs)} are for a task of your own; the built-in "
                        f"'{BUILT_IN}' takes its settings from model.*, loss.* and eval.metrics")
    return
  if not plugins.is_import_path(name):
    raise ConfigError(f"task.name '{name}' is neither '{BUILT_IN}' nor 'package.module:Name' or "
                      f"'path/to/file.py:Name' (a subclass of loops.task.Task)")
  from loops.task.interface import Task  # pylint: disable=import-outside-toplevel
  cls = plugins.load(name, "task.name")
  if not (isinstance(cls, type) and issubclass(cls, Task)):
    raise ConfigError(f"task.name '{name}' is {type(cls).__name__} {cls!r}, not a subclass of loops.task.Task")
  plugins.check_call(cls, (), dict(config.task.kwargs), "task.kwargs", name)
  check_update_every(cls.__name__, getattr(cls, "update_every", {}))
  check_streams(cls.__name__, cls.streams, cls.eval_stream)
  if cls.streams:
    _check_stream_settings(cls.__name__, config)
  if cls.train_step is not Task.train_step:
    if config.train.grad_accum_steps > 1:
      raise ConfigError(f"train.grad_accum_steps={config.train.grad_accum_steps} needs a loss-level task; "
                        f"{name} writes its own train_step (accumulate inside it, or set 1)")
    if cls.transform_gradients is not Task.transform_gradients:
      raise ConfigError(f"{name} writes its own train_step, so transform_gradients is never called: sum its "
                        "gradients with ctx.sum_over_replicas there, or drop train_step (loss level)")
    if cls.eval_step is Task.eval_step and cls.per_example_loss is Task.per_example_loss:
      raise ConfigError(f"{name} writes its own train_step but no eval_step, and the default eval_step reports "
                        "per_example_loss, which it does not define: write eval_step(self, batch, models, ctx) "
                        "returning {name: per-example values} (reported as eval/<name>)")
  elif cls.per_example_loss is Task.per_example_loss:
    raise ConfigError(f"task '{name}' defines neither per_example_loss (loss level) nor train_step (step level)")


def check_streams(task_name, streams, eval_stream):
  """Task.streams is {name: integer k >= 1} with k = 1 for the first (the main stream: the run's global batch);
  Task.eval_stream one of them (or None: the first)."""
  where = f"{task_name}.streams"
  if not isinstance(streams, dict):
    raise ConfigError(f"{where} must be a dict {{stream name: k}} (k x the global batch per step), got "
                      f"{streams!r:.80}")
  for name, k in streams.items():
    if not isinstance(name, str) or not name.isidentifier():
      raise ConfigError(f"{where}: stream names are identifiers (the input function's `stream`), got {name!r}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
      raise ConfigError(f"{where}['{name}'] must be an integer >= 1 (its global batch is k x the run's), got {k!r}")
  if streams and next(iter(streams.values())) != 1:
    first = next(iter(streams))
    raise ConfigError(f"{where}: the first stream ('{first}') is the main one, its batch the run's global batch: "
                      f"its k must be 1, got {streams[first]} (scale the others relative to it)")
  if eval_stream is not None and eval_stream not in streams:
    raise ConfigError(f"{task_name}.eval_stream={eval_stream!r} is not one of its streams {list(streams)}")


def _check_stream_settings(task_name, config):
  """What several streams cannot do yet: asynchronous workers, the tf.data service."""
  if config.strategy == "parameter_server":
    raise ConfigError(f"{task_name} reads several streams, which parameter_server does not feed (its workers read "
                      f"one dataset each); use mirrored or multi_worker_mirrored")
  if config.data.service:
    raise ConfigError(f"{task_name} reads several streams, which the tf.data service does not carry yet; unset "
                      f"data.service")


def check_models(task, models):
  """build_models returned {name: keras.Model}, at least one."""
  where = f"{type(task).__name__}.build_models"
  if not isinstance(models, dict) or not models:
    raise ConfigError(f"{where} must return a non-empty {{name: keras.Model}}, got {models!r:.80}")
  for name, model in models.items():
    if not isinstance(model, keras.Model):
      raise ConfigError(f"{where}: '{name}' is {type(model).__name__}, not a keras.Model")


def check_optimizers(task, models, optimizers, float16=False):
  """build_optimizers returned {model name: optimizer} for trainable models; a loss-level task has at least one;
  under float16 each scales its loss (ctx.optimizer makes them so), one only for a loss-level task."""
  where = f"{type(task).__name__}.build_optimizers"
  own = [attribute for attribute, value in vars(task).items() if isinstance(value, keras.optimizers.Optimizer)
         and all(value is not o and value is not getattr(o, "inner_optimizer", None) for o in optimizers.values())]
  if own:
    raise ConfigError(f"{type(task).__name__}.{own[0]} is an optimizer the task made itself (outside the run's "
                      "strategy, checkpoints and learning-rate schedule): make it in build_optimizers (return "
                      "{model name: ctx.optimizer(...)}) and apply the one train_step gets in its `optimizers` "
                      "argument")
  for name, optimizer in optimizers.items():
    if name not in models:
      raise ConfigError(f"{where}: '{name}' is not a model of the task (models: {sorted(models)})")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
      raise ConfigError(f"{where}: '{name}' is {type(optimizer).__name__}, not a keras optimizer")
    if not models[name].trainable_variables:
      raise ConfigError(f"{where}: model '{name}' has no trainable variables (frozen?); give it no optimizer")
  unscaled = sorted(n for n, o in optimizers.items() if not isinstance(o, keras.optimizers.LossScaleOptimizer))
  if float16 and unscaled:
    raise ConfigError(f"{where}: {unscaled} would not scale the loss under mixed_precision='float16' (float16 "
                      f"gradients underflow): make them with ctx.optimizer(...), or use 'bfloat16'")
  if float16 and len(optimizers) > 1 and not task.writes_step:
    raise ConfigError(f"mixed_precision='float16' scales one loss for one optimizer; {type(task).__name__} has "
                      f"{len(optimizers)} ({sorted(optimizers)}): write a train_step that scales each optimizer's "
                      f"loss, or use 'bfloat16' or 'float32'")
  if not optimizers and not task.writes_step:
    raise ConfigError(f"{where} returned no optimizer: nothing would be trained")
  check_update_every(type(task).__name__, task.update_every, trained=optimizers)


def check_update_every(task_name, periods, trained=None):
  """Task.update_every is {trained model name: integer k >= 1}, at most update_every.MAX_LISTED models (the step
  is traced once per combination of updating models). trained: the models with an optimizer, once built."""
  where = f"{task_name}.update_every"
  if not isinstance(periods, dict):
    raise ConfigError(f"{where} must be a dict {{model name: k}} (update every k steps), got {periods!r:.80}")
  if len(periods) > update_every.MAX_LISTED:
    raise ConfigError(f"{where} lists {len(periods)} models ({sorted(periods)}); at most {update_every.MAX_LISTED} "
                      f"(the step is traced once per combination of models that update)")
  for name, k in periods.items():
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
      raise ConfigError(f"{where}['{name}'] must be an integer >= 1 (the model updates on the steps where "
                        f"step % k == k - 1), got {k!r}")
    if trained is not None and name not in trained:
      raise ConfigError(f"{where} names '{name}', which is not a trained model of the task (models with an "
                        f"optimizer: {sorted(trained)})")


def check_model_outputs(loss_fn, model, input_shape, num_classes, soft_labels=False, batch=4):
  """The built-in classification: calls the model and the loss eagerly on a zero batch (labels as the pipeline
  will give them), so a model output without logits or a reduced loss fails here with its own message, not
  inside a trace."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from loops.task.classification import forward  # pylint: disable=import-outside-toplevel
  images = tf.zeros([batch, *input_shape], tf.float32)
  logits, outputs = forward(model, images, training=False)
  labels = tf.fill([batch, num_classes], 1.0 / num_classes) if soft_labels else tf.zeros([batch], tf.int64)
  loss_fn(labels, logits, images=images, outputs=outputs, step=tf.constant(0, tf.int64))
