"""Checkpoint series under workdir/checkpoints: explicit restore, periodic save, chief vs non-chief directories."""

import json
import os
import shutil
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
