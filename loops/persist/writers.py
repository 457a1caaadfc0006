"""All of a run's output that only the chief writes, decided once: `for_role` gives the chief a Writer and
every other process a NullWriter whose methods do nothing.

Output: TensorBoard summaries, chief-only log lines, JSON files and the exported model in the workdir,
profiler traces. Every file goes through tf.io.gfile, so a workdir on cloud storage works like a local one.
"""

import json
import posixpath

from absl import logging
import numpy as np
import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from errors import unwritable_workdir
from loops.core import console


def read_json(path):
  """The JSON at path, or None when it does not exist or cannot be parsed (e.g. replaced while read)."""
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.loads(f.read())
  except (tf.errors.NotFoundError, ValueError):
    return None


def copy_file(source, destination):
  """Copies one file (any tf.io.gfile path to any other)."""
  tf.io.gfile.copy(source, destination, overwrite=True)


def for_role(workdir, is_chief):
  return Writer(workdir) if is_chief else NullWriter(workdir)


class NullWriter:
  """The writer of a non-chief process: accepts every call, writes nothing."""

  trackers = None

  def __init__(self, workdir):
    self.workdir = workdir

  def read_json(self, name):
    """workdir/name's value, or None (any task may read)."""
    return read_json(posixpath.join(self.workdir, name))

  def prepare_workdir(self, config):
    pass

  def scalars(self, step, values):
    pass

  def text(self, step, tag, markdown):
    pass

  def hparams(self, config, metric_tags, experiment=True):
    pass

  def image_grid(self, step, tag, make_batch, max_images=16):
    """make_batch() -> (images, labels): called only by a writer that writes."""

  def progress_bar(self, mode, total_steps):
    """The live bar (console.LiveBar; mode auto: when stdout and stderr are a terminal), or None."""

  def histograms(self, step, values):
    """values: {tag: array} or a function returning it (called only by a writer that writes)."""

  def info(self, message, *args):
    pass

  def warning(self, message, *args):
    pass

  def start_trace(self, name):
    """A profiler trace into workdir/name (only the chief traces: see Writer.start_trace)."""

  def stop_trace(self):
    pass

  def write_json(self, name, value):
    """Writes workdir/name atomically; returns its path (None when nothing is written)."""

  def save_model(self, model, name):
    """Saves `model` as workdir/name (a .keras file); returns its path (None when nothing is written)."""

  def save_weights(self, model, name):
    """Saves `model`'s weights as workdir/name (a .weights.h5 file); returns its path (None when nothing is
    written)."""

  def save_saved_model(self, write, name):
    """write(path) writes a SavedModel directory at workdir/name (called only by a writer that writes); returns
    its path (None when nothing is written)."""

  def remove(self, name):
    """Removes workdir/name (a file or a directory) when it is there; returns its path if it was (None when
    nothing is written)."""

  def flush(self):
    pass

  def close(self):
    pass


class Writer(NullWriter):
  """The chief's writer. The TensorBoard event file is opened lazily, after prepare_workdir accepted the workdir."""

  # JSON records that also go to the trackers as artifacts (plan.json goes as parameters).
  TRACKED_JSON = ("summary.json", "best.json")

  def __init__(self, workdir):
    super().__init__(workdir)
    self._summary_writer = None
    self.trackers = None  # loops/persist/tracking.Trackers: MLflow, W&B (tracking.*), when configured

  def start_trace(self, name):
    # Only the chief: TF 2.21's profiler corrupts the heap when a non-chief MultiWorkerMirrored worker stops a trace
    # (abort in TraceMeRecorder::Consume): 4 of 86 two-worker runs tracing once; in runs of 1 500 traces, 7 of 11
    # with every worker tracing and 3 of 4 with worker 1 alone (host_tracer_level=1 too), always worker 1; the
    # chief tracing alone, 0 of 6. tests/test_workers_visible.py's slow test reproduces it with TensorFlow alone and
    # fails once a release no longer aborts.
    tf.profiler.experimental.start(posixpath.join(self.workdir, name))

  def stop_trace(self):
    tf.profiler.experimental.stop()

  def track(self, trackers):
    """From now on every scalar, the plan and the JSON records also go to `trackers` (or None)."""
    self.trackers = trackers

  @property
  def _events(self):
    if self._summary_writer is None:
      self._summary_writer = tf.summary.create_file_writer(self.workdir)
    return self._summary_writer

  def prepare_workdir(self, config):
    """Creates the workdir, proves it writable and writes config.json (the resolved config)."""
    try:
      tf.io.gfile.makedirs(self.workdir)
      probe = posixpath.join(self.workdir, ".write-test")
      with tf.io.gfile.GFile(probe, "w") as f:
        f.write("ok")
      tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
      raise unwritable_workdir(self.workdir, e) from None
    self.write_json("config.json", json.loads(config.to_json_best_effort()))

  def scalars(self, step, values):
    with self._events.as_default(step=step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)
    if self.trackers:
      self.trackers.metrics(step, values)

  def text(self, step, tag, markdown):
    with self._events.as_default(step=step):
      tf.summary.text(tag, markdown)

  def hparams(self, config, metric_tags, experiment=True):
    """The HParams tab: every config value as an hparam, the eval scalars as its metrics (the experiment unless
    `experiment` (summary.hparams_experiment) is off: a sweep's trial, whose experiment the sweep writes at its
    directory)."""
    values = flatten(config)
    with self._events.as_default(step=0):
      if experiment:
        hparams_api.hparams_config(hparams=[hparams_api.HParam(name) for name in values],
                                   metrics=[hparams_api.Metric(tag) for tag in metric_tags])
      hparams_api.hparams(values)

  def image_grid(self, step, tag, make_batch, max_images=16):
    """A labelled grid of (preprocessed) input images, rescaled per image for display."""
    images, labels = make_batch()[:2]
    with self._events.as_default(step=step):
      tf.summary.image(tag, _grid_image(np.asarray(images)[:max_images], np.asarray(labels)[:max_images]))

  def progress_bar(self, mode, total_steps):
    if mode == "off" or (mode == "auto" and not console.is_terminal()):
      return None
    return console.LiveBar(total_steps)

  def histograms(self, step, values):
    values = values() if callable(values) else values
    with self._events.as_default(step=step):
      for tag, value in values.items():
        tf.summary.histogram(tag, value)

  def info(self, message, *args):
    logging.info(message, *args)

  def warning(self, message, *args):
    logging.warning(message, *args)

  def write_json(self, name, value):
    path = posixpath.join(self.workdir, name)
    tf.io.gfile.makedirs(posixpath.dirname(path))
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
      f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    if self.trackers and name == "plan.json":
      self.trackers.params({f"plan.{key}": item for key, item in flatten(value).items()})
    elif self.trackers and posixpath.basename(name) in self.TRACKED_JSON:
      self.trackers.json_artifact(posixpath.basename(name), path)
      if name == "summary.json":
        self.trackers.outcome(value)
    return path

  def save_model(self, model, name):
    path = posixpath.join(self.workdir, name)
    tf.io.gfile.makedirs(posixpath.dirname(path))
    model.save(path)
    return path

  def save_weights(self, model, name):
    path = posixpath.join(self.workdir, name)
    tf.io.gfile.makedirs(posixpath.dirname(path))
    model.save_weights(path)
    return path

  def save_saved_model(self, write, name):
    path = posixpath.join(self.workdir, name)
    tf.io.gfile.makedirs(posixpath.dirname(path))
    write(path)
    return path

  def remove(self, name):
    path = posixpath.join(self.workdir, name)
    if not tf.io.gfile.exists(path):
      return None
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    else:
      tf.io.gfile.remove(path)
    return path

  def flush(self):
    if self._summary_writer is not None:
      self._summary_writer.flush()

  def close(self):
    if self._summary_writer is not None:
      self._summary_writer.close()


def format_values(values):
  """'key=value, ...' for log lines (floats to 4 significant digits)."""
  return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


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


def _label_text(label):
  """'3' for a class id; '3:0.70 5:0.30' for soft (mixed) labels: the two largest shares."""
  if np.ndim(label) == 0:
    return str(int(label))
  top = np.argsort(label)[::-1][:2]
  return " ".join(f"{c}:{label[c]:.2f}" for c in top if label[c] > 0)


def _grid_image(images, labels, shown_size=96):
  """[1, height, width, 3] uint8: the images side by side on a white canvas, each rescaled to [0, 1] and enlarged by
  a whole factor towards `shown_size` pixels, each under its label (Pillow's bundled font; matplotlib's figure and
  text layout took 0.08-0.19 s a grid, and importing matplotlib.pyplot 0.7 s)."""
  from PIL import Image, ImageDraw, ImageFont  # pylint: disable=import-outside-toplevel  # at step 0 only

  count, height, width = len(images), images.shape[1], images.shape[2]
  scale = max(1, shown_size // max(height, width))
  height, width = height * scale, width * scale
  columns = int(np.ceil(np.sqrt(count)))
  rows = int(np.ceil(count / columns))
  gap, band = 8, 16  # between images; above each, for its label
  cell_height, cell_width = band + height + gap, width + gap
  corners = [((i // columns) * cell_height + band + gap, (i % columns) * cell_width + gap) for i in range(count)]
  canvas = np.ones((rows * cell_height + gap, columns * cell_width + gap, 3), np.float32)
  for image, (top, left) in zip(images, corners):
    low, high = float(image.min()), float(image.max())
    shown = (image - low) / (high - low) if high > low else np.zeros_like(image)
    shown = np.repeat(np.repeat(shown[..., :3] if shown.shape[-1] >= 3 else shown[..., :1], scale, 0), scale, 1)
    canvas[top:top + height, left:left + width] = shown
  picture = Image.fromarray(np.round(canvas * 255).astype(np.uint8))
  draw, font = ImageDraw.Draw(picture), ImageFont.load_default(size=12)
  for label, (top, left) in zip(labels, corners):
    draw.text((left + width / 2, top - 2), _label_text(label), fill=(0, 0, 0), font=font, anchor="md")
  return np.asarray(picture)[np.newaxis]
