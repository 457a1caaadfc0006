"""train_and_evaluate(config, workdir): the eager outer loop around the compiled steps."""

import contextlib
import json
import math
import os
import sys
import time

from absl import logging
import keras
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

import data
import models
from loops import checkpoints as checkpoints_lib
from loops import cluster
from loops import losses
from loops import optimizers
from loops import parameter_server
from loops import plan as plan_lib
from loops import progress as progress_lib
from loops import steps
from loops import strategy as strategy_lib
from loops import summaries as summaries_lib
from loops.errors import ConfigError, worker_lost


def train_and_evaluate(config, workdir, dry_run=False):
  """Trains config's model on config's data, evaluating and checkpointing as configured; returns the run summary.

  dry_run: check everything a run would (names, values, data, cluster, model), print what the run would do,
  and return that report without training or writing anything.
  """
  determinism = tf_config.is_op_determinism_enabled()  # no public getter in TF 2.21
  try:
    return _train_and_evaluate(config, workdir, dry_run)
  finally:  # process-wide switch: leave it as it was (notebooks, tests running several configs)
    if not determinism:
      tf_config.disable_op_determinism()


def _train_and_evaluate(config, workdir, dry_run):
  wall_started = time.perf_counter()
  plan_lib.validate(config)
  strategy_lib.configure_devices(config)
  task = cluster.from_environment(source=config.cluster.source, slurm_port_base=config.cluster.slurm_port_base)
  if config.strategy == "parameter_server" and task.type in ("worker", "ps"):
    parameter_server.serve(task)  # until stopped
    return None
  strategy = strategy_lib.build(config, task)
  keras.utils.set_random_seed(config.seed)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()

  source = data.load(config.data)
  multi_worker = strategy_lib.is_multi_worker(strategy)
  asynchronous = config.strategy == "parameter_server"
  plan = plan_lib.derive(config, strategy.num_replicas_in_sync, source.train_size,
                         num_input_pipelines=task.num_workers if multi_worker else 1)
  input_shape = data.output_shape(source, config.data)
  loss_fn = losses.build(config.loss)
  losses.validate(loss_fn, source.num_classes)
  logging.info("config:\n%s", config)
  logging.info("plan: %s; data '%s': %d train / %d eval examples, input %s, %d classes",
               plan, source.name, source.train_size, source.eval_size, input_shape, source.num_classes)

  with strategy.scope():
    model = _build_model(config, input_shape, source.num_classes)
    schedule = optimizers.learning_rate_schedule(config.optimizer, plan.learning_rate, plan.total_steps,
                                                 plan.steps_per_epoch)
    optimizer = optimizers.build(config.optimizer, schedule, loss_scaling=config.mixed_precision == "float16")
    optimizer.build(model.trainable_variables)  # before the first step: Keras 3 + multi-replica pitfall.
    step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  # Parameter servers: metrics live on the coordinator (workers would race on shared metric variables).
  with (strategy.scope() if not asynchronous else contextlib.nullcontext()):
    train_metrics = {"loss": keras.metrics.Mean(),
                     "accuracy": keras.metrics.Mean() if asynchronous else keras.metrics.SparseCategoricalAccuracy()}
    eval_metrics = {"loss": keras.metrics.Mean(), "accuracy": keras.metrics.SparseCategoricalAccuracy()}
    if source.num_classes > 5:
      eval_metrics["top5_accuracy"] = keras.metrics.SparseTopKCategoricalAccuracy(k=5)
  logging.info("model %s: %d parameters", config.model.name, model.count_params())
  if dry_run:
    return _dry_run_report(config, workdir, strategy, task, source, plan, input_shape, model)

  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_counter)
  ckpts = checkpoints_lib.Checkpoints(workdir, checkpoint, step_counter, config.checkpoint.keep, task.is_chief)
  best = checkpoints_lib.BestCheckpoint(workdir, checkpoint, step_counter, config.checkpoint.best_metric,
                                        config.checkpoint.best_mode, task.is_chief)
  ckpts.restore_latest()  # refuses a checkpoint of another model before anything in the workdir is touched
  _prepare_workdir(workdir, config, task)  # only once every name, value and checkpoint has been accepted.
  summaries = summaries_lib.Summaries(workdir, enabled=task.is_chief)
  try:
    start_step = int(step_counter.numpy())
    preemption = checkpoints_lib.Preemption(strategy, multi_worker, ckpts, asynchronous or config.strategy == "tpu")
    train_step = steps.make_train_step(model, optimizer, loss_fn, None if asynchronous else train_metrics,
                                       plan.global_batch_size, plan.grad_accum_steps, config.jit_compile)
    eval_step = steps.make_eval_step(model, loss_fn, eval_metrics)
    if asynchronous:
      run_steps, run_eval = parameter_server.make_loops(
          strategy, train_step, step_counter,
          lambda: data.train_dataset(source, config.data, batch_size=plan.global_batch_size,
                                     steps_per_epoch=plan.steps_per_epoch, seed=config.seed,
                                     start_step=start_step, decorrelate=True),
          eval_step, data.eval_dataset(source, config.data, batch_size=plan.global_batch_size), train_metrics)
    else:
      def train_iterator(first_step):
        return iter(_distribute(strategy, multi_worker, plan, lambda batch, shards, index, local: data.train_dataset(
            source, config.data, batch_size=batch, steps_per_epoch=plan.steps_per_epoch * local, seed=config.seed,
            start_step=first_step * local, num_shards=shards, shard_index=index)))

      train_iter = train_iterator(start_step)
      eval_data = _distribute(strategy, multi_worker, plan, lambda batch, shards, index, local: data.eval_dataset(
          source, config.data, batch_size=batch, num_shards=shards, shard_index=index, local_replicas=local))
      train_fn = steps.make_train_fn(strategy, train_step, step_counter)
      eval_fn = steps.make_eval_fn(strategy, eval_step)
      run_steps = lambda num_steps: train_fn(train_iter, tf.constant(num_steps, tf.int32))
      run_eval = lambda: eval_fn(eval_data)

    def evaluate(step):
      for metric in eval_metrics.values():
        metric.reset_state()
      started = time.perf_counter()
      run_eval()
      results = {f"eval/{name}": float(m.result().numpy()) for name, m in eval_metrics.items()}
      summaries.scalars(step, results)
      best.update(step, results)
      if task.is_chief:
        logging.info("eval at step %d: %s (%.1f s)", step, _format(results), time.perf_counter() - started)
      return results

    if start_step == 0:
      summaries.text(0, "config", "```\n" + str(config) + "\n```")
      summaries.hparams(config)
      _log_input_images(summaries, source, config, plan)
    elif start_step >= plan.total_steps:
      logging.info("step %d of %d already done: evaluating only", start_step, plan.total_steps)
    progress = progress_lib.Progress(start_step, plan.total_steps, plan.global_batch_size, plan.steps_per_epoch)
    bar = _progress_bar(config, task, plan, start_step)
    histogram_every = config.summary.histogram_every_steps
    gradient_norms = probe = None
    if histogram_every and not asynchronous:
      probe = next(iter(data.eval_dataset(source, config.data, batch_size=min(64, plan.global_batch_size))))[:2]
      gradient_norms = _make_gradient_norms(strategy, model, loss_fn)
    profile = _profile_range(config)
    profiling = False
    step = start_step
    train_results = {}
    rollbacks = 0
    if config.nan_policy.mode == "rollback" and tf.train.latest_checkpoint(ckpts.directory) is None:
      ckpts.save(step)  # something to roll back to
    while step < plan.total_steps:
      num_steps = min(plan.steps_per_loop - step % plan.steps_per_loop, plan.total_steps - step)
      if profile and task.is_chief and not profiling and step < profile[1] and step + num_steps >= profile[0]:
        tf.profiler.experimental.start(os.path.join(workdir, "profile"))
        profiling = True
      started = time.perf_counter()
      loss = run_steps(num_steps)
      train_results = {"train/loss": float(train_metrics["loss"].result().numpy()),
                       "train/accuracy": float(train_metrics["accuracy"].result().numpy())}
      seconds = time.perf_counter() - started  # the .numpy() above waited for the call to finish.
      step = int(step_counter.numpy())
      if not (tf.math.is_finite(loss) and math.isfinite(train_results["train/loss"])):
        first = step - num_steps + 1
        if config.nan_policy.mode == "stop" or rollbacks >= config.nan_policy.max_retries:
          retried = f" after {rollbacks} rollback(s)" if rollbacks else ""
          raise FloatingPointError(f"non-finite loss in steps {first}..{step}{retried} "
                                   f"(nan_policy.mode={config.nan_policy.mode})")
        rollbacks += 1
        last = step
        restored = ckpts.restore_latest()
        step = int(step_counter.numpy())
        train_iter = train_iterator(step)
        for metric in train_metrics.values():
          metric.reset_state()
        logging.warning("non-finite loss in steps %d..%d: rolled back to %s (step %d), rollback %d of %d",
                        first, last, restored, step, rollbacks, config.nan_policy.max_retries)
        continue
      if profiling and step >= profile[1]:
        tf.profiler.experimental.stop()
        profiling = False
        logging.info("profiler trace of steps %d..%d in %s", *profile, os.path.join(workdir, "profile"))
      finished_epochs = progress.record(step, seconds)
      _report_train(summaries, task, progress, step, train_results, seconds / num_steps, optimizer,
                    finished_epochs)
      if bar:
        bar.update(step, [(k.split("/")[1], v) for k, v in train_results.items()])
      if histogram_every and step % histogram_every == 0:
        norms = gradient_norms(*probe) if gradient_norms else None  # every task: it runs on all replicas
        if task.is_chief:
          summaries.histograms(step, {f"weights/{v.path}": v.numpy() for v in model.trainable_variables})
          if norms is not None:
            summaries.histograms(step, {"gradients/norm_per_variable": norms})
            summaries.scalars(step, {"train/gradient_global_norm": float(tf.norm(norms))})
      for metric in train_metrics.values():
        metric.reset_state()
      preemption.save_and_exit_if_preempted(step, before_exit=summaries.flush)
      if plan.eval_every_steps and step % plan.eval_every_steps == 0 and step < plan.total_steps:
        eval_results = evaluate(step)
      if plan.checkpoint_every_steps and step % plan.checkpoint_every_steps == 0 and step < plan.total_steps:
        ckpts.save(step)
    if profiling:
      tf.profiler.experimental.stop()
    eval_results = evaluate(step)
    if step != start_step or tf.train.latest_checkpoint(ckpts.directory) is None:
      ckpts.save(step)
    export_path = None
    if config.export and task.is_chief:
      export_path = os.path.join(workdir, "export", "model.keras")
      os.makedirs(os.path.dirname(export_path), exist_ok=True)
      model.save(export_path)
      logging.info("exported %s", export_path)
    summaries.flush()
    summary = {
        "step": step,
        "total_steps": plan.total_steps,
        **train_results,
        **eval_results,
        "replicas": plan.replicas,
        "global_batch_size": plan.global_batch_size,
        "learning_rate": plan.learning_rate,
        "train_seconds": progress.train_seconds,
        "wall_seconds": time.perf_counter() - wall_started,
        "nan_rollbacks": rollbacks,
        "examples_per_sec": progress.examples_per_sec() if step != start_step else None,
        "mean_epoch_seconds_excluding_first": progress.mean_epoch_seconds(),
        "checkpoint": tf.train.latest_checkpoint(ckpts.directory),
        "export": export_path,
        **best.summary(),
    }
    if task.is_chief:
      _write_json(os.path.join(workdir, "summary.json"), summary)
      logging.info("done: %s", _format(summary))
      if step != start_step:
        epoch_time = progress.mean_epoch_seconds()
        logging.info("throughput: %.0f images/s over %d steps (%d replica(s)), %s per epoch excluding the first",
                     progress.examples_per_sec(), step - start_step, plan.replicas,
                     f"{epoch_time:.2f} s" if epoch_time else "n/a (fewer than 2 whole epochs)")
    return summary
  except PEER_FAILURES as e:
    if not multi_worker:
      raise
    raise worker_lost(e, locals().get("step", "?"), tf.train.latest_checkpoint(ckpts.directory)) from e
  finally:
    summaries.close()
    ckpts.close()
    best.close()
    if "preemption" in locals():
      preemption.close()


# What a collective raises when a peer task is gone (connection reset, missed heartbeats) or too slow (timeout).
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                 tf.errors.CancelledError)

MIXED_PRECISION = {None: None, "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def _build_model(config, input_shape, num_classes):
  """models.build under config.mixed_precision's Keras dtype policy (restored afterwards: it is global)."""
  if config.mixed_precision not in MIXED_PRECISION:
    raise ConfigError(f"mixed_precision must be None, 'bfloat16' or 'float16', got {config.mixed_precision!r}")
  if config.mixed_precision == "float16" and not tf.config.list_physical_devices("GPU"):
    logging.warning("mixed_precision='float16' on a machine without GPU is emulated and ~100x slower than "
                    "float32 (measured: 47 vs 6 400 images/s on digits); use 'bfloat16' on CPUs")
  previous = keras.mixed_precision.dtype_policy()
  if MIXED_PRECISION[config.mixed_precision]:
    keras.mixed_precision.set_dtype_policy(MIXED_PRECISION[config.mixed_precision])
  try:
    return models.build(config.model.name, input_shape, num_classes)
  finally:
    keras.mixed_precision.set_dtype_policy(previous)


def _distribute(strategy, multi_worker, plan, make_dataset):
  """make_dataset(batch_size, num_shards, shard_index, local_replicas) -> this pipeline's tf.data.Dataset.

  One worker: one pipeline batched by the global batch, split across replicas by tf.distribute.
  Several workers: one pipeline per worker (its shard), batched per replica; each local replica takes one batch.
  """
  if not multi_worker:
    return strategy.experimental_distribute_dataset(make_dataset(plan.global_batch_size, 1, 0, 1))

  def dataset_fn(context):
    local = context.num_replicas_in_sync // context.num_input_pipelines
    return make_dataset(context.get_per_replica_batch_size(plan.global_batch_size), context.num_input_pipelines,
                        context.input_pipeline_id, local)

  return strategy.distribute_datasets_from_function(dataset_fn)


def _dry_run_report(config, workdir, strategy, task, source, plan, input_shape, model):
  report = {
      "dry_run": True,
      "strategy": config.strategy,
      "task": f"{task.type}:{task.index}" + (" (chief)" if task.is_chief else ""),
      "replicas": plan.replicas,
      "global_batch_size": plan.global_batch_size,
      "per_replica_batch_size": plan.per_replica_batch_size,
      "grad_accum_steps": plan.grad_accum_steps,
      "learning_rate": plan.learning_rate,
      "lr_scaling": config.optimizer.lr_scaling,
      "schedule": config.optimizer.schedule,
      "dataset": source.name,
      "train_examples": source.train_size,
      "eval_examples": source.eval_size,
      "input_shape": list(input_shape),
      "num_classes": source.num_classes,
      "steps_per_epoch": plan.steps_per_epoch,
      "total_steps": plan.total_steps,
      "epochs": round(plan.epochs, 3),
      "model": config.model.name,
      "parameters": model.count_params(),
      "workdir": os.path.abspath(workdir),
      "checkpoints": os.path.join(os.path.abspath(workdir), "checkpoints"),
      "resumes_from": tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints")),
  }
  print(f"config:\n{config}")
  print("dry run (nothing trained or written):")
  for key, value in report.items():
    print(f"  {key}: {value}")
  return report


def _log_input_images(summaries, source, config, plan):
  """Grids of the first train and eval inputs after preprocessing, with labels (own pipelines, not the run's)."""
  if not summaries.enabled:
    return
  train = data.train_dataset(source, config.data, batch_size=min(16, plan.global_batch_size),
                             steps_per_epoch=1, seed=config.seed)
  images, labels = next(iter(train))
  summaries.image_grid(0, "train/input_images", images, labels)
  images, labels, _ = next(iter(data.eval_dataset(source, config.data, batch_size=16)))
  summaries.image_grid(0, "eval/input_images", images, labels)


def _make_gradient_norms(strategy, model, loss_fn):
  """fn(images, labels) -> per-variable gradient norms on a fixed probe batch (inference mode: BatchNorm
  statistics untouched; no optimizer step). Runs on every replica without collectives; returns replica 0's."""

  def norms(images, labels):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(loss_fn(labels, tf.cast(model(images, training=False), tf.float32)))
    return tf.stack([tf.norm(g) for g in tape.gradient(loss, model.trainable_variables)])

  @tf.function
  def run(images, labels):
    return strategy.run(norms, args=(images, labels))

  return lambda images, labels: strategy.experimental_local_results(run(images, labels))[0].numpy()


def _profile_range(config):
  steps_range = tuple(config.summary.profile_steps)
  if not steps_range:
    return None
  if len(steps_range) != 2 or not 0 <= steps_range[0] < steps_range[1]:
    raise ConfigError(f"summary.profile_steps must be (first, last) with 0 <= first < last, got {steps_range}")
  return steps_range


def _progress_bar(config, task, plan, start_step):
  """A Keras Progbar on the chief when asked for (summary.progress_bar: auto = when stdout is a terminal)."""
  wanted = config.summary.progress_bar
  if wanted not in ("auto", "on", "off"):
    raise ConfigError(f"summary.progress_bar must be auto, on or off, got '{wanted}'")
  if not task.is_chief or wanted == "off" or (wanted == "auto" and not sys.stdout.isatty()):
    return None
  bar = keras.utils.Progbar(plan.total_steps, stateful_metrics=["loss", "accuracy"], unit_name="step")
  bar.update(start_step)
  return bar


def _report_train(summaries, task, progress, step, results, step_time, optimizer, finished_epochs):
  lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
  summaries.scalars(step, {**results, "train/learning_rate": lr,
                           "train/examples_per_sec": progress.examples_per_sec(),
                           "train/step_time_sec": step_time})
  for epoch, seconds in finished_epochs.items():
    summaries.scalars(step, {"train/epoch_time_sec": seconds})
  if not task.is_chief:
    return
  epoch_time = ""
  if finished_epochs:
    epoch_time = f", epoch {max(finished_epochs)} took {finished_epochs[max(finished_epochs)]:.2f} s"
  logging.info("step %d/%d (epoch %.2f): loss %.4f, accuracy %.4f, %.0f images/s, ETA %s%s", step,
               progress.total_steps, step / progress.steps_per_epoch, results["train/loss"],
               results["train/accuracy"], progress.examples_per_sec(),
               progress_lib.format_duration(progress.eta_seconds()), epoch_time)


def _prepare_workdir(workdir, config, task):
  if not task.is_chief:
    return
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, ".write-test")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"workdir '{workdir}' is not writable: {e.strerror}") from None
  _write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))


def _write_json(path, value):
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(temporary, path)


def _format(values):
  return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
