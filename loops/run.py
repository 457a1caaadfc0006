"""train_and_evaluate(config, workdir): the rules, build, restore, then the outer loop with its callbacks.

  rules.check(config)            every setting, before anything is built or written (loops/rules.py)
  rules.check_role(config, role) the strategy against the cluster and the devices
  build.build_from(settings, ..) strategy, data, plan, model, optimizer, loss, metrics, checkpoint
  execution.make(parts, ...)     how this strategy family trains and evaluates (loops/distribute/)
  Checkpoints.restore_run(...)   the latest or the warm start, callback state, the preemption handler, learning
                                 rates, in that order (loops/persist/checkpoints.py)
  Loop(...).run()                the sequence (loops/core/loop.py); built-in and user callbacks do the rest
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import posixpath
import time
from typing import Any, Iterable, Optional

from absl import logging

from configs import settings as settings_lib
from errors import ConfigError, config_error_within
from loops import build as build_lib
from loops import callbacks as callbacks_lib
from loops import rules as rules_lib
from loops import dry_run as dry_run_lib
from loops import evaluate_once
from loops import predict as predict_lib
from loops import resume as resume_lib
from loops import sidecar
from loops.core import loop as loop_lib
from loops.core.nan_guard import NanGuard
from loops.distribute import cluster
from loops.distribute import execution as execution_lib
from loops.distribute import startup
from loops.distribute import strategy as strategy_lib
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import tracking
from loops.persist import workdir_lock
from loops.persist import writers


@atexit.register
def _free_input_pipelines_while_python_runs():
  """Frees the run's tf.data iterators (held in reference cycles) before the interpreter finalizes. Freed later, an
  iterator whose map still has calls into Python running (a user's py_function after a failed batch) waits forever
  on them: a thread that reaches for the GIL during finalization is ended, and its call never completes."""
  gc.collect()


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
    The run summary (what summary.json holds); the dry-run report; the evaluator's summary for an evaluator process;
    None for a parameter-server worker or ps process (they serve until stopped).

  Raises:
    errors.ConfigError: a setting, name, value, cluster or dataset the run cannot use (one line).
  """
  with build_lib.determinism_restored():
    try:
      return _train_and_evaluate(config, workdir, dry_run, callbacks)
    except Exception as e:  # pylint: disable=broad-except
      raised_in_a_trace = None if isinstance(e, ConfigError) else config_error_within(e)
      if raised_in_a_trace is None:
        raise
      raise raised_in_a_trace from None  # a task's step refused while traced: the one line, not AutoGraph's frame


def _train_and_evaluate(config, workdir, dry_run, callback_objects):
  wall_started = time.perf_counter()
  rules_lib.check(config)
  settings = settings_lib.read(config)  # the bag read once; modules are handed the sections they use
  strategy_lib.configure_devices(settings.run)
  role = build_lib.cluster_role(settings.cluster, workdir)
  run, evaluation = settings.run, settings.eval
  if run.mode == "evaluate" and not role.is_evaluator:
    role = cluster.ClusterRole(type="evaluator", cluster=role.cluster)
  rules_lib.check_role(config, role)
  chosen = evaluate_once.chosen(workdir, evaluation.checkpoint) if role.is_evaluator and evaluation.checkpoint else None
  predicting = run.mode == "predict" and not role.is_evaluator
  chosen = predict_lib.chosen(settings.predict.checkpoint, workdir) if predicting else chosen
  if role.is_distributed and not dry_run:
    startup.check_port_free(role)
  if role.is_distributed and dry_run:  # the plan needs the strategy, which starts with every peer
    logging.warning("dry run of worker %d of %d: the multi-worker strategy starts only with every peer (%s), so this "
                    "waits for them (at most cluster.startup_timeout_seconds=%g s); start the others too, or dry-run "
                    "one machine's share with --config.cluster.source=local --config.strategy=mirrored",
                    role.worker_index, role.num_workers,
                    ", ".join(role.cluster.get("worker", [])), settings.cluster.startup_timeout_seconds)
  if execution_lib.serve_if_server(settings.run.strategy, role):
    return None
  with contextlib.ExitStack() as cleanup:
    if not dry_run:  # before anything is built, restored or written: a second run on this workdir stops here
      locked = posixpath.join(workdir, "eval" if role.is_evaluator else "predictions" if predicting else "")
      cleanup.enter_context(workdir_lock.held(locked.rstrip("/"), role.is_chief or role.is_evaluator))
    resume = resume_lib.decide(config, workdir, trains=not (role.is_evaluator or predicting),
                               accept_changes=settings.resume.accept_changes)
    parts = build_lib.build_from(settings, config, role, kept=resume.kept)
    named_callbacks = callbacks_lib.load_user(config, settings.run.callbacks, settings.sweep, settings.checkpoint,
                                              settings.eval, callback_objects)
    rules_lib.check_callbacks(named_callbacks)
    user_callbacks = [callback for _, callback in named_callbacks]
    if dry_run:
      return dry_run_lib.report(settings, str(config), workdir, parts, user_callbacks)
    if predicting:
      return predict_lib.run(settings.predict, settings.data, settings.task.name, workdir, parts, chosen)
    if chosen:
      return evaluate_once.run(settings.data, workdir, parts, chosen,
                               lambda: _execution(parts, settings))
    if role.is_evaluator:
      return sidecar.Sidecar(config, workdir, parts, _execution(parts, settings), settings.checkpoint,
                             settings.eval, settings.tracking, settings.task.name).run()
    return _train(config, settings, workdir, parts, user_callbacks, wall_started, cleanup, resume)


def _execution(parts, settings):
  """How this strategy family trains and evaluates (loops/distribute/execution.py), given its sections."""
  return execution_lib.make(parts, settings.run, settings.preemption)


def _train(config, settings, workdir, parts, user_callbacks, wall_started, cleanup, resume):
  role = parts.role
  checkpoints = checkpoints_lib.Checkpoints.for_run(settings.checkpoint, settings.init, settings.run.strategy, workdir,
                                                    parts, parts.twin)
  cleanup.callback(checkpoints.close)
  execution = _execution(parts, settings)  # its train input starts in Loop.run, at the restored step
  nan_guard = NanGuard(settings.nan_policy.mode, settings.nan_policy.max_retries, checkpoints, execution,
                       log=logging.warning)
  run = callbacks_lib.Run(config, workdir, parts, execution, checkpoints, wall_started)
  observers = callbacks_lib.make(run, settings, callbacks_lib.OBSERVERS)
  saving = callbacks_lib.make(run, settings, callbacks_lib.SAVING)
  restored = checkpoints.restore_run(observers + saving, user_callbacks, execution.preemption)
  preemption = restored.preemption
  cleanup.callback(preemption.close)
  writer = writers.for_role(workdir, role.is_chief)
  writer.prepare_workdir(config)  # only once every name, value and checkpoint has been accepted
  if restored.warm_start_table:
    writer.info("%s", restored.warm_start_table)
  cleanup.callback(writer.close)
  tags = tracking.run_tags(settings.task, settings.run, settings.sweep, parts.plan, role)
  trackers = tracking.start(settings.tracking, tags, writers.flatten(config), workdir, role)
  if trackers:
    cleanup.push(trackers.on_exit)
    writer.track(trackers)
  writer.write_json("plan.json", dataclasses.asdict(parts.plan))  # the derived values (the evaluator's end step)
  resume_lib.record(resume, config, parts.plan, execution.step, workdir, role)
  state = loop_lib.State(step=execution.step, total_steps=parts.plan.total_steps,
                         steps_per_epoch=parts.plan.steps_per_epoch, is_chief=role.is_chief, workdir=workdir,
                         writer=writer, config=config, models=parts.models)
  state.summary.update(restored.warm_start_counts)
  ordered = callbacks_lib.assemble([nan_guard, *observers], user_callbacks, [preemption, *saving])
  loop = loop_lib.Loop(execution, ordered, state, steps_per_loop=parts.plan.steps_per_loop,
                       eval_every_steps=settings.eval.every_steps, nan_guard=nan_guard, user_callbacks=user_callbacks,
                       on_error=None if strategy_lib.is_multi_worker(parts.strategy) else checkpoints.save_on_error)
  try:
    return dict(loop.run().summary)
  except execution_lib.PEER_FAILURES as e:
    lost = execution_lib.lost_worker_error(parts.strategy, e, state.step, checkpoints.latest())
    if lost is None:
      raise
    raise lost from e
