"""Eval metrics by name or import path; each reports as `eval/<metric.name>`.

`eval.metrics` names entries of METRICS or "package.module:factory" strings whose `factory()` returns a
keras.metrics.Metric updated as `update_state(labels, logits, sample_weight=weights)` (weight 0 = padding).
`eval/loss` is always reported. Metrics are created inside the strategy's scope, so their totals cover every
replica and worker.
"""

from absl import logging
import keras

from loops.core import plugins

METRICS = {
    "accuracy": lambda: keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
    "top5_accuracy": lambda: keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5_accuracy"),
}
LOSS = "loss"


def build(names, num_classes):
  """[(entry, metric)]: the loss mean first, then eval.metrics in order (loops/rules.py's check_metrics judges
  what the factories returned). Call inside the metrics' scope."""
  made = [(LOSS, keras.metrics.Mean(name=LOSS))]
  for name in names:
    if name == "top5_accuracy" and num_classes <= 5:
      logging.info("eval metric top5_accuracy left out: the data has only %d classes", num_classes)
      continue
    made.append((name, METRICS[name]() if name in METRICS else plugins.load(name, "eval.metrics")()))
  return made


def by_name(made):
  """{metric.name: metric} of build()'s checked entries."""
  return {metric.name: metric for _, metric in made}


def tags(metrics):
  return [f"eval/{name}" for name in metrics]
