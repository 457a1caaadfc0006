"""Checkpoint series under workdir/checkpoints: explicit restore, periodic save, chief vs non-chief directories."""

import json
import os
import shutil
import signal
import sys
import threading
import tempfile

from absl import logging
import tensorflow as tf

from loops.errors import ConfigError


class Checkpoints:
  """Every task saves (saves may involve collectives); only the chief's series lands in the workdir.

  Non-chief tasks write to a private temporary directory that `close()` removes.
  """

  def __init__(self, workdir, checkpoint, step_counter, keep, is_chief, subdir="checkpoints"):
    self.directory = os.path.join(workdir, subdir)
    self._temporary = None if is_chief else tempfile.mkdtemp(prefix="ckpt-nonchief-")
    self._checkpoint = checkpoint
    self._manager = tf.train.CheckpointManager(
        checkpoint, self._temporary or self.directory, max_to_keep=keep, step_counter=step_counter)
    self._chief_manager = self._manager if is_chief else None

  def restore_latest(self):
    """Restores the chief's latest checkpoint if there is one; returns its path or None. Never partial."""
    path = tf.train.latest_checkpoint(self.directory)
    if path is None:
      return None
    try:
      self._checkpoint.restore(path).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ConfigError(f"checkpoint {path} does not match this model/optimizer (another model or shape?): "
                        f"{first}; use a new --workdir") from None
    logging.info("restored %s", path)
    return path

  @property
  def manager(self):
    return self._manager

  def save(self, step):
    path = self._manager.save(checkpoint_number=step)
    if self._chief_manager is not None:
      logging.info("saved checkpoint %s", path)
    return path if self._chief_manager is not None else None

  def close(self):
    if self._temporary:
      shutil.rmtree(self._temporary, ignore_errors=True)


class BestCheckpoint:
  """Keeps the checkpoint with the best eval metric in workdir/best (one checkpoint + best.json)."""

  def __init__(self, workdir, checkpoint, step_counter, metric, mode, is_chief):
    if mode not in ("max", "min"):
      raise ConfigError(f"checkpoint.best_mode must be 'max' or 'min', got '{mode}'")
    self.metric, self.mode, self.is_chief = metric, mode, is_chief
    self._checkpoints = Checkpoints(workdir, checkpoint, step_counter, 1, is_chief, subdir="best") if metric else None
    self._record = os.path.join(workdir, "best", "best.json")
    self.value = self.step = None
    if metric and os.path.exists(self._record):
      with open(self._record) as f:
        saved = json.load(f)
      self.value, self.step = saved["value"], saved["step"]

  def update(self, step, results):
    """Saves when results[metric] beats the best so far (every task decides alike: metrics are reduced)."""
    if not self._checkpoints:
      return
    if self.metric not in results:
      raise ConfigError(f"checkpoint.best_metric '{self.metric}' is not an eval metric; valid: "
                        f"{', '.join(sorted(results))} or '' (off)")
    value = results[self.metric]
    better = self.value is None or (value > self.value if self.mode == "max" else value < self.value)
    if not better or step == self.step:
      return
    self.value, self.step = value, step
    self._checkpoints.save(step)
    if self.is_chief:
      with open(self._record + ".tmp", "w") as f:
        json.dump({"metric": self.metric, "value": value, "step": step}, f)
      os.replace(self._record + ".tmp", self._record)

  def summary(self):
    if not self._checkpoints:
      return {}
    return {"best_metric": self.metric, "best_value": self.value, "best_step": self.step,
            "best_checkpoint": tf.train.latest_checkpoint(self._checkpoints.directory) if self.is_chief else None}

  def close(self):
    if self._checkpoints:
      self._checkpoints.close()


PREEMPTED_EXIT_CODE = 42  # TensorFlow's convention (PreemptionCheckpointHandler): "preempted, checkpoint saved".


class Preemption:
  """On SIGTERM: every task saves a checkpoint at the current step and exits with code 42.

  Synchronous strategies use TensorFlow's PreemptionCheckpointHandler (it agrees on the step across workers
  through the coordination service). Parameter-server coordinators and TPUs, which it does not cover here,
  get the equivalent: a SIGTERM flag checked after each train call, then a save and exit 42. Checked once per
  train call (train.steps_per_loop steps), so a preempted run loses no saved work and at most one call of time.
  """

  def __init__(self, strategy, multi_worker, checkpoints, use_flag):
    self._checkpoints = checkpoints
    self._handler = None
    self._flag = threading.Event()
    self._previous = signal.getsignal(signal.SIGTERM)
    if use_flag:
      signal.signal(signal.SIGTERM, lambda signum, frame: self._flag.set())
    else:
      resolver = (strategy.cluster_resolver if multi_worker
                  else tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({})))
      config = tf.distribute.experimental.TerminationConfig(exit_fn=self._exit, grace_period=0)
      self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
          resolver, checkpoints.manager, termination_config=config)
    self._before_exit = None

  def save_and_exit_if_preempted(self, step, before_exit=None):
    self._before_exit = before_exit
    if self._handler is not None:
      self._handler.save_checkpoint_if_preempted(checkpoint_number=step)
    elif self._flag.is_set():
      self._checkpoints.save(step)
      self._exit()

  def _exit(self):
    logging.warning("preempted (SIGTERM): checkpoint saved; exiting with code %d; rerun the same command to "
                    "resume", PREEMPTED_EXIT_CODE)
    if self._before_exit:
      self._before_exit()
    logging.flush()
    sys.exit(PREEMPTED_EXIT_CODE)

  def close(self):
    signal.signal(signal.SIGTERM, self._previous)
