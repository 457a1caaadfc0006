"""Eval metrics by name or import path; each reports as `eval/<metric.name>`.

`eval.metrics` names entries of METRICS or "package.module:factory" strings whose `factory()` returns a
keras.metrics.Metric updated as `update_state(labels, logits, sample_weight=weights)` (weight 0 = padding).
`eval/loss` is always reported. Metrics are created inside the strategy's scope, so their totals cover every
replica and worker.
"""

from absl import logging
import keras

from loops import plugins
from loops.errors import ConfigError, unknown_name

METRICS = {
    "accuracy": lambda: keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
    "top5_accuracy": lambda: keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5_accuracy"),
}
LOSS = "loss"


def check_names(names):
  """Checks every entry of eval.metrics without creating a metric; returns the known result tags (eval/...),
  or None when an import-path metric names itself only once built."""
  if isinstance(names, str) or not all(isinstance(name, str) for name in names):
    raise ConfigError(f"eval.metrics must be a tuple of names, got {names!r}")
  tags, complete = [f"eval/{LOSS}"], True
  for name in names:
    if plugins.is_import_path(name):
      plugins.load_callable(name, "eval.metrics", 0)
      complete = False
    elif name not in METRICS:
      raise unknown_name("eval metric", name, list(METRICS) + ["package.module:factory"])
    else:
      tags.append(f"eval/{name}")
  return tags if complete else None


def build(names, num_classes):
  """{name: metric}: the loss mean first, then eval.metrics in order. Call inside the metrics' scope."""
  metrics = {LOSS: keras.metrics.Mean(name=LOSS)}
  for name in names:
    if name == "top5_accuracy" and num_classes <= 5:
      logging.info("eval metric top5_accuracy left out: the data has only %d classes", num_classes)
      continue
    metric = _make(name)
    if metric.name in metrics:
      raise ConfigError(f"two eval metrics are named '{metric.name}' (eval.metrics={tuple(names)}); "
                        f"give each its own name")
    metrics[metric.name] = metric
  return metrics


def _make(name):
  if name in METRICS:
    return METRICS[name]()
  metric = plugins.load(name, "eval.metrics")()
  if not isinstance(metric, keras.metrics.Metric):
    raise ConfigError(f"eval.metrics entry '{name}' returned {type(metric).__name__}, not a keras.metrics.Metric")
  return metric


def tags(metrics):
  return [f"eval/{name}" for name in metrics]
