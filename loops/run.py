"""train_and_evaluate(config, workdir): check, build, restore, then the outer loop with its callbacks.

  check.check(config)            every setting, before anything is built or written (loops/check.py)
  check.check_task(config, task) the strategy against the cluster and the devices
  build.build(config, task)      strategy, data, plan, model, optimizer, loss, metrics, checkpoint
  execution.make(parts, config)  how this strategy family trains and evaluates (loops/distribute/)
  Loop(...).run()                the sequence (loops/core/loop.py); built-in and user callbacks do the rest
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import time
from typing import Any, Iterable, Optional

from absl import logging
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

import data
from loops import build as build_lib
from loops import callbacks as callbacks_lib
from loops import check as check_lib
from loops import report
from loops import resume as resume_lib
from loops import sidecar
from loops.core import loop as loop_lib
from loops.core.nan_guard import NanGuard
from loops.distribute import cluster
from loops.distribute import execution as execution_lib
from loops.distribute import memory
from loops.distribute import startup
from loops.distribute import strategy as strategy_lib
from loops.model import model as model_lib
from loops.model import optimizers
from loops.persist import async_saves
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import init_checkpoint
from loops.persist import workdir_lock
from loops.persist import writers


def train_and_evaluate(config: Any, workdir: str, dry_run: bool = False,
                       callbacks: Iterable[Any] = ()) -> Optional[dict]:
  """Trains config's model on config's data, evaluating and checkpointing as configured.

  Rerunning on the same workdir resumes from its latest checkpoint.

  Args:
    config: an ml_collections config with every key of configs/base.py (after command-line overrides).
    workdir: where checkpoints, TensorBoard events and JSON records go; any tf.io.gfile path.
    dry_run: check everything a run would (names, values, data, cluster, model), print what the run would do and
      return that report, training and writing nothing.
    callbacks: objects with any of the hooks of loops.callbacks.Callback, run after those named in
      config.callbacks.

  Returns:
    The run summary (what summary.json holds); the dry-run report; the evaluator's summary for an evaluator task;
    None for a parameter-server worker or ps task (they serve until stopped).

  Raises:
    errors.ConfigError: a setting, name, value, cluster or dataset the run cannot use (one line).
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
  task = cluster.from_environment(source=config.cluster.source, slurm_port_base=config.cluster.slurm_port_base,
                                  workdir=workdir, startup_timeout_seconds=config.cluster.startup_timeout_seconds)
  if config.mode == "evaluate" and not task.is_evaluator:
    task = cluster.ClusterTask(type="evaluator", cluster=task.cluster)
  check_lib.check_task(config, task)
  if task.is_distributed and not dry_run:
    startup.check_port_free(task)
  if execution_lib.serve_if_server(config, task):
    return None
  with contextlib.ExitStack() as cleanup:
    if not dry_run:  # before anything is built, restored or written: a second run on this workdir stops here
      locked = posixpath.join(workdir, "eval") if task.is_evaluator else workdir  # one evaluator per workdir
      cleanup.enter_context(workdir_lock.held(locked, task.is_chief or task.is_evaluator))
    resume = resume_lib.decide(config, workdir, trains=not task.is_evaluator)
    parts = build_lib.build(config, task, kept=resume.kept)
    named_callbacks = callbacks_lib.load_user(config, callback_objects)
    check_lib.check_callbacks(named_callbacks)
    user_callbacks = [callback for _, callback in named_callbacks]
    if dry_run:
      return report.dry_run(config, workdir, parts, user_callbacks)
    if task.is_evaluator:
      return sidecar.Sidecar(config, workdir, parts).run()
    return _train(config, workdir, parts, user_callbacks, wall_started, cleanup, resume)


def _train(config, workdir, parts, user_callbacks, wall_started, cleanup, resume):
  task = parts.task
  checkpoints = checkpoints_lib.Checkpoints(workdir, parts.checkpoint, parts.step_counter, config.checkpoint.keep,
                                            task.is_chief, async_save=async_saves.async_save_enabled(config))
  cleanup.callback(checkpoints.close)
  restored = checkpoints.restore_latest()  # refuses a checkpoint of another model before the workdir is touched
  _checkpoint_callback_states(parts.checkpoint, user_callbacks)
  init_table, init_counts = _warm_start(config, parts, restored)  # a refusal also stops before anything is written
  writer = writers.for_task(workdir, task.is_chief)
  writer.prepare_workdir(config)  # only once every name, value and checkpoint has been accepted
  if init_table:
    writer.info("%s", init_table)
  writer.write_json("plan.json", dataclasses.asdict(parts.plan))  # the derived values (the evaluator's end step)
  cleanup.callback(writer.close)
  execution = execution_lib.make(parts, config)
  resume_lib.record(resume, config, parts.plan, execution.step, workdir, task)
  state = loop_lib.State(step=execution.step, total_steps=parts.plan.total_steps,
                         steps_per_epoch=parts.plan.steps_per_epoch, is_chief=task.is_chief, workdir=workdir,
                         writer=writer, config=config, models=parts.models)
  state.summary.update(init_counts)
  nan_guard = NanGuard(config.nan_policy.mode, config.nan_policy.max_retries, checkpoints, execution,
                       log=logging.warning)
  observers, saving_phase = _built_in_callbacks(config, workdir, parts, execution, checkpoints, nan_guard,
                                                wall_started, cleanup)
  # after every restore (TensorFlow's preemption handler restores the latest checkpoint again when it is made)
  for name, optimizer in parts.optimizers.items():
    optimizers.set_constant_learning_rate(optimizer, parts.learning_rates[name])
  loop = loop_lib.Loop(execution, callbacks_lib.assemble(observers, user_callbacks, saving_phase), state,
                       steps_per_loop=parts.plan.steps_per_loop, eval_every_steps=config.eval.every_steps,
                       nan_guard=nan_guard)
  try:
    return dict(loop.run().summary)
  except execution_lib.PEER_FAILURES as e:
    lost = execution_lib.lost_worker_error(parts.strategy, e, state.step, checkpoints.latest())
    if lost is None:
      raise
    raise lost from e


def _checkpoint_callback_states(checkpoint, callbacks):
  """Each callback's `checkpointed` joins the checkpoint as callbacks/<index>_<class>, after the restore: TF's
  deferred restoration assigns what the checkpoint holds for it (a callback new to a resumed run starts afresh)."""
  states = {f"{index}_{type(c).__name__}": c.checkpointed for index, c in enumerate(callbacks)
            if getattr(c, "checkpointed", None) is not None}
  if states:
    checkpoint.callbacks = states


def _warm_start(config, parts, restored):
  """(table text or "", summary counts): init.checkpoint loaded into a new run; a resumed run ignores it."""
  if not config.init.checkpoint:
    return "", {}
  if restored:
    logging.warning("resuming from %s: init.checkpoint '%s' is ignored (it only initialises a new run)", restored,
                    config.init.checkpoint)
    return "", {}
  twin = lambda: model_lib.build_model(config, parts.input_shape, parts.source.num_classes)
  return init_checkpoint.warm_start(config.init, parts.model, parts.optimizer, parts.strategy, twin)


def _profile_folder(task):
  """Where this task's profiler traces go: workdir/profile (the chief), workdir/profile/worker-i (the others)."""
  return "profile" if task.is_chief else f"profile/{task.type}-{task.index}"


def _built_in_callbacks(config, workdir, parts, execution, checkpoints, nan_guard, wall_started, cleanup):
  """(observers, saving phase): the built-ins that run before and after the user's callbacks."""
  best = callbacks_lib.BestCheckpoint(workdir, parts.checkpoint, parts.step_counter,
                                      config.checkpoint.best_metric, config.checkpoint.best_mode, parts.task.is_chief,
                                      execution.averaged_weights)
  cleanup.callback(best.close)
  preemption = execution.preemption(checkpoints)
  cleanup.callback(preemption.close)
  observers = [
      nan_guard,
      callbacks_lib.ProfileTrace(config.summary.profile_steps, parts.plan.steps_per_loop, _profile_folder(parts.task)),
      callbacks_lib.Overview(config, parts.eval_tags,
                             (lambda: _first_inputs(config, parts)) if _image_features(parts) else None),
      callbacks_lib.TrainLog(parts.optimizer, parts.plan.global_batch_size, config.summary.progress_bar),
      callbacks_lib.WorkerMonitor(config.summary.straggler_fraction, config.summary.straggler_calls,
                                  memory.usage_mb),
      callbacks_lib.Histograms(config.summary.histogram_every_steps, parts.model, execution),
      callbacks_lib.EvalLog(),
      best,
  ]
  stopping = config.early_stopping
  if stopping.metric:
    observers.append(callbacks_lib.EarlyStopping(stopping.metric, stopping.mode, stopping.patience,
                                                 stopping.min_delta, parts.run_variables))
  saving_phase = [
      preemption,
      callbacks_lib.Checkpointing(checkpoints, config.checkpoint.every_steps,
                                  parts.run_variables.stopped_total_steps),
      _export(config, parts, execution),
      callbacks_lib.RunSummary(parts.plan, wall_started),
  ]
  return observers, saving_phase


def _image_features(parts):
  return parts.source.image_shape is not None and isinstance(parts.element_spec[0], tf.TensorSpec)


def _export(config, parts, execution):
  """The built-in classification serves raw images through the eval's preprocessing; a task serves its
  features as its model takes them."""
  if config.task.name == check_lib.task_checks.BUILT_IN:
    return callbacks_lib.Export(parts.model, config.export, execution.averaged_weights,
                                data.eval_images(parts.source, config.data), data.raw_image_spec(parts.source))
  return callbacks_lib.Export(parts.model, config.export, execution.averaged_weights, None,
                              parts.training_task.serving_spec(parts.element_spec[0]))


def _first_inputs(config, parts):
  """16 train and 16 eval inputs after preprocessing, from pipelines of their own (not the run's; local)."""
  local = config.data.copy_and_resolve_references()
  local.service = ""
  train = data.train_dataset(parts.source, local, batch_size=min(16, parts.plan.global_batch_size),
                             steps_per_epoch=parts.plan.steps_per_epoch, seed=config.seed)
  evaluation = data.eval_dataset(parts.source, config.data, batch_size=16)
  return next(iter(train)), next(iter(evaluation))
