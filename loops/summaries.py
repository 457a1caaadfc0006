"""TensorBoard writing, chief only: one switch between a real writer and a no-op one."""

import io

import numpy as np
import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

EVAL_METRICS = ("eval/accuracy", "eval/loss", "eval/top5_accuracy")


class Summaries:

  def __init__(self, logdir, enabled):
    self.enabled = enabled
    self._writer = tf.summary.create_file_writer(logdir) if enabled else tf.summary.create_noop_writer()

  def scalars(self, step, values):
    with self._writer.as_default(step=step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)

  def text(self, step, tag, markdown):
    with self._writer.as_default(step=step):
      tf.summary.text(tag, markdown)

  def hparams(self, config):
    """The HParams tab: every config value as an hparam, the eval scalars as its metrics."""
    if not self.enabled:
      return
    values = flatten(config)
    with self._writer.as_default(step=0):
      hparams_api.hparams_config(hparams=[hparams_api.HParam(name) for name in values],
                                 metrics=[hparams_api.Metric(tag) for tag in EVAL_METRICS])
      hparams_api.hparams(values)

  def image_grid(self, step, tag, images, labels, max_images=16):
    """A labelled grid of (preprocessed) input images, rescaled per image for display."""
    if not self.enabled:
      return
    with self._writer.as_default(step=step):
      tf.summary.image(tag, _grid_png(np.asarray(images)[:max_images], np.asarray(labels)[:max_images]))

  def histograms(self, step, values):
    if not self.enabled:
      return
    with self._writer.as_default(step=step):
      for tag, value in values.items():
        tf.summary.histogram(tag, value)

  def flush(self):
    self._writer.flush()

  def close(self):
    self._writer.close()


def flatten(config, prefix=""):
  """{'optimizer.learning_rate': 0.1, ...}: hparam-friendly values (tuples and None as strings)."""
  flat = {}
  for key, value in config.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      flat.update(flatten(value, name + "."))
    elif isinstance(value, (bool, int, float, str)):
      flat[name] = value
    else:
      flat[name] = str(value)
  return flat


def _grid_png(images, labels):
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  count = len(images)
  columns = int(np.ceil(np.sqrt(count)))
  rows = int(np.ceil(count / columns))
  figure, axes = plt.subplots(rows, columns, figsize=(1.6 * columns, 1.8 * rows), squeeze=False)
  for ax in axes.flat:
    ax.axis("off")
  for ax, image, label in zip(axes.flat, images, labels):
    low, high = float(image.min()), float(image.max())
    shown = (image - low) / (high - low) if high > low else np.zeros_like(image)
    ax.imshow(shown[..., 0] if shown.shape[-1] == 1 else shown, cmap="gray" if shown.shape[-1] == 1 else None)
    ax.set_title(str(int(label)), fontsize=9)
  figure.tight_layout()
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=80)
  plt.close(figure)
  return tf.image.decode_png(buffer.getvalue(), channels=4)[tf.newaxis]
