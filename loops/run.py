"""train_and_evaluate(config, workdir): check, build, restore, then the outer loop with its callbacks.

  check.check(config)          every setting, before anything is built or written
  build.build(config, task)    strategy, data, plan, model, optimizer, loss, metrics, checkpoint
  execution.make(parts, ...)   how this strategy family trains and evaluates
  loop.Loop(...).run()         the sequence; built-in and user callbacks do the periodic work
"""

import contextlib
import dataclasses
import math
import os
import posixpath
import time

from absl import logging
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

import data
from data import resident as resident_lib
from loops import build as build_lib
from loops import callbacks as callbacks_lib
from loops import check as check_lib
from loops import checkpoints as checkpoints_lib
from loops import cluster
from loops import execution as execution_lib
from loops import fused_batchnorm
from loops import loop as loop_lib
from loops import metrics as metrics_lib
from loops import saving
from loops import sidecar
from loops import strategy as strategy_lib
from loops import workdir_lock
from loops import writers


def train_and_evaluate(config, workdir, dry_run=False, callbacks=()):
  """Trains config's model on config's data, evaluating and checkpointing as configured; returns the run summary.

  callbacks: objects with any of the hooks of loops/loop.py (after those named in config.callbacks).
  dry_run: check everything a run would (names, values, data, cluster, model), print what the run would do,
  and return that report without training or writing anything.
  """
  determinism = tf_config.is_op_determinism_enabled()  # no public getter in TF 2.21
  try:
    return _train_and_evaluate(config, workdir, dry_run, callbacks)
  finally:  # process-wide switch: leave it as it was (notebooks, tests running several configs)
    if not determinism:
      tf_config.disable_op_determinism()


def _train_and_evaluate(config, workdir, dry_run, callback_objects):
  wall_started = time.perf_counter()
  check_lib.check(config)
  strategy_lib.configure_devices(config)
  task = cluster.from_environment(source=config.cluster.source, slurm_port_base=config.cluster.slurm_port_base)
  if config.mode == "evaluate" and not task.is_evaluator:
    task = cluster.Task(type="evaluator", cluster=task.cluster)
  if execution_lib.serve_if_server(config, task):
    return None
  with contextlib.ExitStack() as cleanup:
    if not dry_run:  # before anything is built, restored or written: a second run on this workdir stops here
      locked = posixpath.join(workdir, "eval") if task.is_evaluator else workdir  # one evaluator per workdir
      cleanup.enter_context(workdir_lock.held(locked, task.is_chief or task.is_evaluator))
    parts = build_lib.build(config, task)
    user_callbacks = callbacks_lib.load_user_callbacks(config, callback_objects)
    if dry_run:
      return _dry_run_report(config, workdir, parts, user_callbacks)
    if task.is_evaluator:
      return sidecar.Sidecar(config, workdir, parts).run()
    return _train(config, workdir, parts, user_callbacks, wall_started, cleanup)


def _train(config, workdir, parts, user_callbacks, wall_started, cleanup):
  task = parts.task
  checkpoints = checkpoints_lib.Checkpoints(workdir, parts.checkpoint, parts.step_counter, config.checkpoint.keep,
                                            task.is_chief)
  cleanup.callback(checkpoints.close)
  best = checkpoints_lib.BestCheckpoint(workdir, parts.checkpoint, parts.step_counter,
                                        config.checkpoint.best_metric, config.checkpoint.best_mode, task.is_chief)
  cleanup.callback(best.close)
  checkpoints.restore_latest()  # refuses a checkpoint of another model before anything in the workdir is touched
  writer = writers.for_task(workdir, task.is_chief)
  writer.prepare_workdir(config)  # only once every name, value and checkpoint has been accepted
  writer.write_json("plan.json", dataclasses.asdict(parts.plan))  # the derived values (the evaluator's end step)
  cleanup.callback(writer.close)
  execution = execution_lib.make(parts, config)
  watcher = execution.preemption(checkpoints)
  cleanup.callback(watcher.close)
  state = loop_lib.State(step=execution.step, total_steps=parts.plan.total_steps,
                         steps_per_epoch=parts.plan.steps_per_epoch, is_chief=task.is_chief, workdir=workdir,
                         writer=writer, config=config)
  nan_guard = loop_lib.NanGuard(config.nan_policy.mode, config.nan_policy.max_retries, checkpoints, execution,
                                log=logging.warning)
  every = _built_in_callbacks(config, parts, execution, checkpoints, best, watcher, nan_guard, wall_started)
  loop = loop_lib.Loop(execution, callbacks_lib.assemble(every[0], user_callbacks, every[1]), state,
                       steps_per_loop=parts.plan.steps_per_loop, eval_every_steps=config.eval.every_steps,
                       nan_guard=nan_guard)
  try:
    return dict(loop.run().summary)
  except execution_lib.PEER_FAILURES as e:
    lost = execution_lib.lost_worker_error(parts.strategy, e, state.step, checkpoints.latest())
    if lost is None:
      raise
    raise lost from e


def _built_in_callbacks(config, parts, execution, checkpoints, best, watcher, nan_guard, wall_started):
  """(observers, saving phase): the built-ins before and after the user's callbacks."""
  observers = [
      nan_guard,
      callbacks_lib.ProfileTrace(config.summary.profile_steps, parts.plan.steps_per_loop),
      callbacks_lib.Overview(config, metrics_lib.tags(parts.eval_metrics), lambda: _first_inputs(config, parts)),
      callbacks_lib.TrainLog(parts.optimizer, parts.plan.global_batch_size, config.summary.progress_bar),
      callbacks_lib.Histograms(config.summary.histogram_every_steps, parts.model, execution),
      callbacks_lib.EvalLog(),
      callbacks_lib.BestCheckpoint(best, execution.averaged_weights),
  ]
  stopping = config.early_stopping
  if stopping.metric:
    observers.append(callbacks_lib.EarlyStopping(stopping.metric, stopping.mode, stopping.patience,
                                                 stopping.min_delta, parts.run_variables))
  saving_phase = [
      callbacks_lib.Preemption(watcher),
      saving.Checkpointing(checkpoints, config.checkpoint.every_steps, parts.run_variables.stopped_total_steps),
      saving.Export(parts.model, config.export, execution.averaged_weights),
      saving.RunSummary(parts.plan, wall_started),
  ]
  return observers, saving_phase


def _first_inputs(config, parts):
  """16 train and 16 eval inputs after preprocessing, from pipelines of their own (not the run's)."""
  train = data.train_dataset(parts.source, config.data, batch_size=min(16, parts.plan.global_batch_size),
                             steps_per_epoch=1, seed=config.seed)
  evaluation = data.eval_dataset(parts.source, config.data, batch_size=16)
  return next(iter(train)), next(iter(evaluation))


def _dry_run_report(config, workdir, parts, user_callbacks):
  plan, source, task = parts.plan, parts.source, parts.task
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
      "input_shape": list(parts.input_shape),
      "device_resident": _residency_line(parts, config),
      "num_classes": source.num_classes,
      "steps_per_epoch": plan.steps_per_epoch,
      "total_steps": plan.total_steps,
      "steps_per_loop": plan.steps_per_loop,
      "epochs": round(plan.epochs, 3),
      "model": config.model.name,
      "parameters": parts.model.count_params(),
      "fused_batchnorm_layers": fused_batchnorm.fused_layers(parts.model),
      **({"gradient_all_reduce": _packs_line(parts, config)} if strategy_lib.is_multi_worker(parts.strategy) else {}),
      "eval_metrics": metrics_lib.tags(parts.eval_metrics),
      "early_stopping": config.early_stopping.metric or "off",
      "callbacks": [type(c).__name__ for c in user_callbacks],
      "workdir": _absolute(workdir),
      "checkpoints": posixpath.join(_absolute(workdir), "checkpoints"),
      "resumes_from": tf.train.latest_checkpoint(posixpath.join(workdir, "checkpoints")),
  }
  print(f"config:\n{config}")
  print("dry run (nothing trained or written):")
  for key, value in report.items():
    print(f"  {key}: {value}")
  return report


def _residency_line(parts, config):
  residency = execution_lib.residency(parts, config)
  if residency.resident:
    block = resident_lib.block_bytes(parts.source, config.data, parts.plan.per_replica_batch_size,
                                     parts.plan.steps_per_loop)
    return (f"yes, {residency.bytes_per_device} bytes per device + {block} bytes for a call's gathered batches "
            f"({residency.reason})")
  return f"no: host pipeline ({residency.reason})"


def _packs_line(parts, config):
  sizes = [math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in parts.model.trainable_variables]
  packs = strategy_lib.gradient_packs(sizes, config.cluster.bytes_per_pack)
  return (f"{len(packs)} pack(s) per step, {sum(sizes)} bytes of gradients when every trainable variable has a "
          f"dense one (cluster.bytes_per_pack={config.cluster.bytes_per_pack}; packs: {packs})")


def _absolute(path):
  return path if "://" in path else os.path.abspath(path)
