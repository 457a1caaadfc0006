"""Overview: at step 0, the resolved config as text, the HParams tab, grids of the first train and eval inputs."""

import dataclasses

import tensorflow as tf

import data
from loops.core.interfaces import Callback


class Overview(Callback):
  """Writes (chief only) the run's overview at step 0.

  Args:
    config: the resolved config.
    metric_tags: the eval result tags (the HParams tab's metrics).
    first_batches: fn() -> (train batch, eval batch); called only by a writer that writes, at most once;
      None when the inputs are not images.
    hparams_experiment: summary.hparams_experiment (the HParams tab's experiment, else its session only).
  """

  def __init__(self, config, metric_tags, first_batches, hparams_experiment=True):
    self.config, self.metric_tags, self.first_batches, self._batches = config, metric_tags, first_batches, None
    self.hparams_experiment = hparams_experiment

  READS = ("run", "summary")

  @classmethod
  def for_run(cls, run, run_settings, summary):
    parts = run.parts
    images = parts.source.image_shape is not None and isinstance(parts.element_spec[0], tf.TensorSpec)
    first = (lambda: _first_inputs(parts, run_settings.seed)) if images else None
    return cls(run.config, parts.eval_tags, first, summary.hparams_experiment)

  def on_train_begin(self, state):
    if state.step != 0:
      return
    state.writer.text(0, "config", "```\n" + str(self.config) + "\n```")
    state.writer.hparams(self.config, self.metric_tags, self.hparams_experiment)
    if self.first_batches is not None:  # image inputs only
      state.writer.image_grid(0, "train/input_images", lambda: self._first_batches()[0])
      state.writer.image_grid(0, "eval/input_images", lambda: self._first_batches()[1])

  def _first_batches(self):
    self._batches = self._batches or self.first_batches()
    return self._batches


def _first_inputs(parts, seed):
  """16 train and 16 eval inputs after preprocessing, from pipelines of their own (not the run's; local). Record
  files are read as one stream without a shuffle window: 16 records, not a window per stream (8 x 2 048 by
  default, read again after the run's own), and a data.streams above 16 has rows to share."""
  local = dataclasses.replace(parts.data_settings, service="")
  if parts.source.train_files is not None:
    local = dataclasses.replace(local, streams=1, shuffle_window=1)
  train = data.train_dataset(parts.source, local, batch_size=min(16, parts.plan.global_batch_size),
                             steps_per_epoch=parts.plan.steps_per_epoch, seed=seed)
  evaluation = data.eval_dataset(parts.source, parts.data_settings, batch_size=16)
  return next(iter(train)), next(iter(evaluation))
