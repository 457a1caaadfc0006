"""The rules of what is trained and how it is judged: model, loss, precision, optimizer, eval metrics (loops/rules.py
runs `check_settings` before anything is built; build.py runs `check_metrics` on the metrics it made)."""

import inspect

from errors import ConfigError, at_least, one_of, unknown_name
from loops.core import plugins
from loops.modeling import losses
from loops.modeling import metrics as metrics_lib
from loops.modeling import model as model_lib
from loops.modeling import optimizers
from loops.modeling import remat

MIXED_PRECISION = (None, "bfloat16", "float16")


def check_settings(config):
  """model.*, loss.*, mixed_precision, optimizer.* and eval.metrics on their own. Returns the eval result tags
  (eval/...) when every metric is a registry name, else None (an import-path metric names itself once built)."""
  check_model(config.model)
  if plugins.is_import_path(config.loss.name):
    plugins.load_callable(config.loss.name, "loss.name", 2, losses.EXTRA)
  elif config.loss.name:  # "": the model's compiled loss, else losses.DEFAULT
    one_of("loss", config.loss.name, list(losses.LOSSES) + ["package.module:function", "'' (compiled)"])
  if not 0.0 <= config.loss.label_smoothing < 1.0:
    raise ConfigError(f"loss.label_smoothing must be in [0, 1), got {config.loss.label_smoothing}")
  one_of("mixed_precision", config.mixed_precision, MIXED_PRECISION)
  _check_optimizer(config.optimizer)
  return _check_metric_names(tuple(config.eval.metrics))


def check_model(model_config):
  """model.name resolves and model.kwargs fit its signature; no TensorFlow state."""
  fn = model_lib.model_function(model_config.name)
  plugins.check_call(fn, ((1, 1, 1), 2), dict(model_config.kwargs), "model.kwargs", model_config.name)
  _check_remat(model_config)


def _check_remat(model_config):
  """model.remat is a mode; its setting is there and sensible."""
  one_of("model.remat", model_config.remat, list(remat.MODES))
  at_least("model.remat_output_size", model_config.remat_output_size, 1, "a number of values per example")
  patterns = list(model_config.remat_layers)
  if model_config.remat == "list_of_layers" and not patterns:
    raise ConfigError("model.remat='list_of_layers' needs model.remat_layers: layer names or patterns, e.g. "
                      "--config.model.remat_layers='[\"conv2_block1_*\"]'")
  if patterns and not all(isinstance(p, str) and p for p in patterns):
    raise ConfigError(f"model.remat_layers must be layer names or fnmatch patterns (strings), got {patterns}")


def _check_metric_names(names):
  if isinstance(names, str) or not all(isinstance(name, str) for name in names):
    raise ConfigError(f"eval.metrics must be a tuple of names, got {names!r}")
  tags, complete = [f"eval/{metrics_lib.LOSS}"], True
  for name in names:
    if plugins.is_import_path(name):
      plugins.load_callable(name, "eval.metrics", 0)
      complete = False
    elif name not in metrics_lib.METRICS:
      raise unknown_name("eval metric", name, list(metrics_lib.METRICS) + ["package.module:factory"])
    else:
      tags.append(f"eval/{name}")
  return tags if complete else None


def _check_optimizer(o):
  one_of("optimizer", o.name, optimizers.OPTIMIZERS)
  one_of("optimizer.lr_scaling rule", o.lr_scaling, optimizers.LR_SCALING)
  one_of("optimizer.schedule", o.schedule, optimizers.SCHEDULES)
  if not o.learning_rate > 0:
    raise ConfigError(f"optimizer.learning_rate must be > 0, got {o.learning_rate}")
  if o.warmup_epochs < 0 or o.momentum < 0:
    raise ConfigError(f"optimizer.warmup_epochs and optimizer.momentum must be >= 0, got {o.warmup_epochs} and "
                      f"{o.momentum}")
  if not 0.0 <= o.ema_decay < 1.0:
    raise ConfigError(f"optimizer.ema_decay must be in [0, 1) (0 = off; e.g. 0.999), got {o.ema_decay}")
  epochs = list(o.decay_epochs)
  if o.schedule == "piecewise" and (not epochs or epochs != sorted(epochs) or epochs[0] <= 0):
    raise ConfigError(f"optimizer.schedule='piecewise' needs optimizer.decay_epochs in increasing order (> 0), "
                      f"got {tuple(epochs)}")


def check_metrics(made, names):
  """What the eval metric factories returned: keras Metrics with names of their own.

  Args:
    made: [(eval.metrics entry, metric)] from loops/modeling/metrics.py's build.
    names: config.eval.metrics, for the message.
  """
  import keras
  seen = set()
  for entry, metric in made:
    if not isinstance(metric, keras.metrics.Metric):
      raise ConfigError(f"eval.metrics entry '{entry}' returned {type(metric).__name__}, not a keras.metrics.Metric")
    if metric.name in seen:
      raise ConfigError(f"two eval metrics are named '{metric.name}' (eval.metrics={tuple(names)}); "
                        f"give each its own name")
    seen.add(metric.name)
    if entry != metrics_lib.LOSS:  # the loss mean is the run's own, updated with the per-example losses
      _check_update_state(entry, metric)


def _check_update_state(entry, metric):
  """The run calls update_state(labels, logits, sample_weight=weights): a metric that cannot take that call fails
  here, before anything is trained, naming its file and line."""
  update = metric.update_state
  try:
    inspect.signature(update).bind(None, None, sample_weight=None)
  except TypeError:
    code = getattr(getattr(type(metric), "update_state", None), "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
    raise ConfigError(f"eval.metrics entry '{entry}': {type(metric).__name__}.update_state{inspect.signature(update)}"
                      f"{where} must take (labels, logits, sample_weight=None)") from None
  except ValueError:  # no signature to read
    pass
