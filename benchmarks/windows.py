"""Timed windows shared by the data benchmarks (no flags): a folder of generated JPEGs, a window of the framework's
compiled training loop, a window of an input pipeline alone, and interleaved rounds of windows."""

import os
import time

import keras
import numpy as np
import tensorflow as tf

from loops.distribute import steps
from loops.modeling import losses
from loops.modeling import optimizers
from loops.task import classification


def make_folder(root, count, size, classes=10):
  """count train and count // 10 test JPEGs: a class colour plus noise, so the labels are learnable."""
  rng = np.random.default_rng(0)
  for split, n in (("train", count), ("test", max(classes, count // 10))):
    for i in range(n):
      label = i % classes
      folder = os.path.join(root, split, f"class_{label}")
      tf.io.gfile.makedirs(folder)
      image = rng.integers(0, 64, (size, size, 3)) + np.array([25 * label, 255 - 25 * label, 128])
      with tf.io.gfile.GFile(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
        f.write(tf.io.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8), quality=90).numpy())


def training_window(config, strategy, plan, reference, dataset, calls_per_window):
  """window(): `calls_per_window` calls of the framework's compiled loop (with the call's read-out of its train
  metrics, as a run makes it) on a fresh copy of `reference`."""
  with strategy.scope():
    model = keras.models.clone_model(reference)
    model.set_weights(reference.get_weights())
    optimizer = optimizers.build(config.optimizer, plan.learning_rate)
    optimizer.build(model.trainable_variables)
    metrics = {"loss": keras.metrics.Mean(), "accuracy": keras.metrics.SparseCategoricalAccuracy()}
    counter = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  task = classification.ImageClassification(losses.build(config.loss))
  step_fn = steps.make_task_train_step(task, {"model": model}, {"model": optimizer}, metrics, plan.global_batch_size,
                                       counter)
  train_fn = steps.make_train_fn(strategy, step_fn, counter, steps.CallReadOut(strategy, metrics))  # as a run's
  iterator = iter(strategy.experimental_distribute_dataset(dataset))
  calls = tf.constant(plan.steps_per_loop, tf.int32)

  def window():
    for _ in range(calls_per_window):
      read_out = train_fn(iterator, calls)
    read_out.numpy()  # one host sync per window, as a run has per call
  return window


def pipeline_window(dataset, batches):
  """window(): pull `batches` batches without training (the pipeline's headroom over the training rate)."""
  iterator = iter(dataset)

  def window():
    for _ in range(batches):
      next(iterator)
  return window


def interleaved_seconds(windows, rounds):
  """{name: [seconds of each round]}: every window once untimed (tracing, start-up), then `rounds` rounds of all
  windows in turn, so a slow spell of the machine hits every contender alike. A window that returns a number has
  timed itself (e.g. after an untimed part); otherwise its whole call is timed."""
  for window in windows.values():  # warm-up: tracing and pipeline start-up, not timed
    window()
  seconds = {name: [] for name in windows}
  for _ in range(rounds):
    for name, window in windows.items():
      started = time.perf_counter()
      timed_itself = window()
      seconds[name].append(timed_itself if timed_itself is not None else time.perf_counter() - started)
  return seconds
