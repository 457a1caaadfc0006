"""mode=predict: a checkpoint's outputs (the task's predict_step; the classifier's probabilities, class and label)
for every example of the data's eval split or of a folder of images, on any strategy: each replica and worker
predicts its share, the chief writes every example once, in input order, the padded tail dropped
(loops/persist/predictions.py: .npz parts and a manifest). A rerun after a kill resumes after the last whole part.

  python main.py --config=configs/digits_cnn.py --workdir=runs/digits --config.mode=predict \\
      --config.predict.checkpoint=best
"""

import contextlib
import posixpath
import time

from absl import logging
import numpy as np
import tensorflow as tf

import data
from loops import evaluate_once
from loops import task as task_lib
from loops.core import console
from loops.distribute import execution as execution_lib
from loops.distribute import steps
from loops.distribute import strategy as strategy_lib
from loops.persist import checkpoints
from loops.persist import predictions

KEY = "predict.checkpoint"
LOG_EVERY_SECONDS = 10.0


def chosen(checkpoint, workdir):
  """(step, path) of the checkpoint `checkpoint` (predict.checkpoint) names; one line naming what there is
  otherwise."""
  return evaluate_once.chosen(workdir, checkpoint, KEY)


def run(predict, data_settings, task_name, workdir, parts, selection):
  """Predicts every example with the checkpoint `selection` ((step, path)); returns the manifest (chief).

  predict, data_settings: those settings; task_name: task.name."""
  step, path = selection
  evaluate_once.restore_chosen(parts, path, KEY)
  source, paths, name = _input(predict, data_settings, parts)
  described = predict.input or evaluate_once.input_described(data_settings)
  files = predictions.Files(posixpath.join(workdir, "predictions", f"{name}-{step}"), predict.rows_per_file,
                            {"checkpoint": path, "step": step, "input": described, "examples": source.eval_size})
  chief = parts.role.is_chief
  done = _agreed(parts, files.start(checkpoints.same_values) if chief else 0)
  if done >= source.eval_size:
    logging.info("predictions of %s for %s are complete in %s", path, described, files.directory)
    return files.manifest() if chief else None
  labels = task_name == task_lib.BUILT_IN and not predict.input
  started = time.perf_counter()
  with _progress(chief, source.eval_size, done) as show, execution_lib.averaged_weights(parts):
    for index, columns in _rows(parts, source, done, labels):
      if paths is not None:
        columns["path"] = paths[index]
      if chief:
        files.add(index, columns)
      show(int(index[-1]) + 1 if len(index) else done)
  seconds = time.perf_counter() - started
  rate = (source.eval_size - done) / max(seconds, 1e-9)
  logging.info("predicted %d examples (%d this run) in %.1f s, %.0f examples/s, with %s (step %d) on %d "
               "replica(s): %s", source.eval_size, source.eval_size - done, seconds, rate, path, step,
               parts.strategy.num_replicas_in_sync, posixpath.join(files.directory, predictions.MANIFEST))
  if not chief:
    return None
  return files.finish({"seconds": round(seconds, 3), "examples_per_second": round(rate, 1),
                       "timed_examples": source.eval_size - done,  # this run's: a resumed one's seconds are its own
                       "replicas": parts.strategy.num_replicas_in_sync, "workers": _predicting_workers(parts)})


def _predicting_workers(parts):
  """The processes that computed predictions: the coordinator alone under parameter_server."""
  return 1 if execution_lib.asynchronous(parts.strategy) else max(parts.role.num_workers, 1)


def _input(predict, data_settings, parts):
  """(source whose eval split is predicted, the image paths or None, the directory's name)."""
  where = predict.input
  if not where:
    return parts.source, None, evaluate_once.input_name(data_settings)
  source, paths = data.image_files(parts.source, where)
  folder = where.rstrip("/") if tf.io.gfile.isdir(where) else posixpath.dirname(where)
  return source, np.array(paths), evaluate_once.safe(posixpath.basename(folder) or "input")


def _agreed(parts, done):
  """The chief's count of rows already written, on every worker (one sum over workers)."""
  role = parts.role
  if not strategy_lib.is_multi_worker(parts.strategy):
    return done
  total = steps.make_sum_over_workers(parts.strategy, role.num_workers)(tf.constant(float(done), tf.float64))
  return int(round(float(total)))


def _rows(parts, source, start, labels):
  """(index, {name: numpy rows}) per global batch from `start`, padding dropped, in input order."""
  p = parts
  step_fn = steps.make_predict_step(p.task, p.models, p.plan.global_batch_size, p.step_counter,
                                    p.plan.input_pipelines, labels)

  def dataset(batch, shards, shard, local):
    return data.eval_dataset(source, p.data_settings, batch_size=batch, num_shards=shards, shard_index=shard,
                             local_replicas=local, start=start, indexed=True)

  if execution_lib.asynchronous(p.strategy):  # the parameter-server coordinator predicts itself
    fn, batches = tf.function(step_fn, reduce_retracing=True), dataset(p.plan.global_batch_size, 1, 0, 1)
    outputs = (fn(*batch) for batch in batches)
  else:
    gathered = steps.make_gathered(p.strategy, step_fn)
    outputs = (gathered(batch) for batch in execution_lib.distribute_dataset(
        p.strategy, p.plan.global_batch_size, dataset))
  for values, weights, index in outputs:
    real = weights.numpy() > 0
    index = index.numpy()[real]
    order = np.argsort(index, kind="stable")
    yield index[order], {name: value.numpy()[real][order] for name, value in values.items()}


@contextlib.contextmanager
def _progress(chief, total, done):
  """show(examples done): a live bar on a terminal, else a log line every LOG_EVERY_SECONDS (chief only)."""
  bar = console.LiveBar(total) if chief and console.is_terminal() else None
  started, last = time.perf_counter(), [time.perf_counter()]

  def show(count):
    now = time.perf_counter()
    rate = f"{(count - done) / max(now - started, 1e-9):.0f} examples/s"
    if bar is not None:
      bar.update(count, rate)
    elif chief and now - last[0] >= LOG_EVERY_SECONDS:
      last[0] = now
      logging.info("predicted %d/%d examples, %s", count, total, rate)

  try:
    yield show
  finally:
    if bar is not None:
      bar.close()
