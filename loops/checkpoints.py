"""Checkpoint series under workdir/checkpoints: explicit restore, periodic save, chief vs non-chief directories."""

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

  def __init__(self, workdir, checkpoint, step_counter, keep, is_chief):
    self.directory = os.path.join(workdir, "checkpoints")
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
