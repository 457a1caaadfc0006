"""The sidecar evaluator (config.mode=evaluate, or a TF_CONFIG task of type "evaluator"): trains nothing.

It watches workdir/checkpoints, evaluates every new checkpoint once (in step order, on the full eval set, with the
EMA weights when the run keeps them), writes eval/... summaries to workdir/eval, keeps the best checkpoint by
checkpoint.best_metric in workdir/eval/best, and exits once it has evaluated the training's final checkpoint:
the step of the workdir's plan.json (written by the chief at the start of each run), or the step where an
early-stopped run ended (summary.json). A restarted evaluator goes on after the last step it evaluated
(workdir/eval/evaluated.json), and after a final one too when the training has since been extended.
"""

import contextlib
import posixpath
import time

from absl import logging

from errors import ConfigError
from loops.callbacks.checkpointing import BestCheckpoint
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import tracking
from loops.persist import writers
from loops.persist.writers import format_values, read_json

PROGRESS = "evaluated.json"
WAITING_LOG_SECONDS = 60.0  # while no new checkpoint comes, say what the evaluator waits for this often


def is_final(workdir, step):
  """Whether `step` is where the training ends: plan.json's total, or the step an early-stopped run of that length
  ended at (a run continued to a longer one goes on)."""
  plan = read_json(posixpath.join(workdir, "plan.json")) or {}
  summary = read_json(posixpath.join(workdir, "summary.json")) or {}
  if plan.get("total_steps") is not None and step >= plan["total_steps"]:
    return True
  return (bool(summary.get("stopped_early")) and summary.get("step") == step
          and summary.get("total_steps") == plan.get("total_steps"))


class Sidecar:
  """Evaluates a training run's checkpoints as they appear; run() returns the summary of what it evaluated.

  Args:
    config: the resolved config bag, as a record only (eval/config.json, the tracker's params).
    workdir, parts, execution: the run's (loops/build.Parts, loops/distribute/execution).
    checkpoint, evaluation, tracking_settings: the checkpoint, eval and tracking settings.
    task_name: task.name.
  """

  def __init__(self, config, workdir, parts, execution, checkpoint, evaluation, tracking_settings, task_name):
    self.config, self.workdir, self.parts = config, workdir, parts
    self.evaluation, self.tracking_settings, self.task_name = evaluation, tracking_settings, task_name
    self.checkpoint_dir = posixpath.join(workdir, "checkpoints")
    self.eval_dir = posixpath.join(workdir, "eval")
    self.writer = writers.Writer(self.eval_dir)
    self.execution = execution
    best = checkpoints_lib.Series(self.eval_dir, parts.checkpoint, parts.step_counter, 1, True, subdir="best")
    self.best = BestCheckpoint(self.eval_dir, best, checkpoint.best_metric, checkpoint.best_mode, True,
                               self.execution.averaged_weights)
    done = read_json(posixpath.join(self.eval_dir, PROGRESS)) or {}
    self.last_step, self.results = done.get("step", -1), done.get("eval", {})
    self.final = bool(done.get("final")) and is_final(workdir, self.last_step)  # not after the training was extended
    self.cleanup, self.tracking_started = None, False

  def run(self):
    self.writer.prepare_workdir(self.config)
    with contextlib.ExitStack() as self.cleanup:
      self.cleanup.callback(self.writer.close)
      self._watch()
    summary = {"step": self.last_step, **self.results, **self.best.summary()}
    logging.info("evaluator done: %s", format_values(summary))
    return summary

  def _watch(self):
    """Evaluates each new checkpoint until the final one; ConfigError after sidecar_timeout_seconds without one."""
    poll, timeout = self.evaluation.sidecar_poll_seconds, self.evaluation.sidecar_timeout_seconds
    waited_since, said_at = time.monotonic(), None
    while not self.final:
      pending = [(s, p) for s, p in checkpoints_lib.steps_of(self.checkpoint_dir) if s > self.last_step]
      for step, path in pending:
        self._evaluate(step, path)
      now = time.monotonic()
      if pending:
        waited_since, said_at = now, None
        continue
      if now - waited_since > timeout:
        raise ConfigError(f"evaluator: no new checkpoint in {self.checkpoint_dir} for {timeout:.0f} s "
                          f"(eval.sidecar_timeout_seconds; last evaluated step {self.last_step}); is the "
                          "training running?")
      if said_at is None or now - said_at >= WAITING_LOG_SECONDS:
        said_at = now
        self._say_waiting(now - waited_since, timeout)
      time.sleep(poll)

  def _track(self):
    """MLflow and W&B (tracking.*) from the first evaluation on: by then the training's tracker run, this one's
    parent, is usually recorded in the workdir."""
    if self.tracking_started:
      return
    self.tracking_started = True
    trackers = tracking.start_evaluator(self.tracking_settings, self.task_name, writers.flatten(self.config),
                                        self.workdir)
    if trackers:
      self.cleanup.push(trackers.on_exit)
      self.writer.track(trackers)

  def _say_waiting(self, waited, timeout):
    after = f"a checkpoint after step {self.last_step}" if self.last_step >= 0 else "the first checkpoint"
    logging.info("evaluator: waiting for %s in %s (%.0f s so far; gives up after %.0f s: "
                 "eval.sidecar_timeout_seconds)", after, self.checkpoint_dir, max(waited, 0.0), timeout)

  def _evaluate(self, step, path):
    damage = checkpoints_lib.Checkpoints.restore_to_evaluate(self.parts.checkpoint, path)
    if damage:  # removed meanwhile (checkpoint.keep) or torn
      logging.warning("evaluator: skipping checkpoint %s (%s)", path, damage)
      return
    results = self.execution.evaluate()
    self._track()
    self.writer.scalars(step, results)
    self.writer.flush()
    self.best.update(step, results, self.writer)
    self.last_step, self.results, self.final = step, results, is_final(self.workdir, step)
    self.writer.write_json(PROGRESS, {"step": step, "eval": results, "final": self.final})
    logging.info("evaluated %s (step %d%s): %s", path, step, ", final" if self.final else "",
                 format_values(results))
