"""Callbacks' own checkpointed state (loops/persist/checkpoints.attach and _restore, the primitive under each of
the owner's restores): restored where a checkpoint holds it, left as it is where not; values a checkpoint holds for
no object of this run are not read."""

import math

import pytest
import tensorflow as tf

from errors import ConfigError
from loops import callbacks as callbacks_lib
from loops.persist import checkpoints as checkpoints_lib
from loops.persist.checkpoints import _restore as restore  # pylint: disable=protected-access


def _built_ins():
  return [callbacks_lib.EarlyStopping("eval/loss", "min", 3, 0.0), callbacks_lib.Checkpointing(None, 0)]


def _attached(step_value=0):
  """(checkpoint, its step, EarlyStopping, Checkpointing) with the built-ins' state attached."""
  step = tf.Variable(step_value, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(step=step, callbacks=checkpoints_lib.callbacks_node())
  stopping, checkpointing = _built_ins()
  checkpoints_lib.attach(checkpoint, [stopping, checkpointing], [])
  return checkpoint, step, stopping, checkpointing


def _values(stopping, checkpointing):
  return ({k: float(v.numpy()) for k, v in stopping.checkpointed.items()},
          int(checkpointing.stopped_total_steps.numpy()))


def _checkpoint_with_foreign_values(directory, step):
  """A checkpoint that holds, besides the step, values under run/ that no object of the runs below has."""
  run = tf.Module()
  run.stopped_total_steps = tf.Variable(120, dtype=tf.int64)
  run.early_stopping_best = tf.Variable(0.25, dtype=tf.float64)
  run.early_stopping_best_step = tf.Variable(80, dtype=tf.int64)
  run.early_stopping_evals_since = tf.Variable(2, dtype=tf.int64)
  return tf.train.Checkpoint(step=step, run=run).save(str(directory / "old"))


def test_values_a_checkpoint_holds_for_no_object_of_this_run_are_not_read(tmp_path):
  path = _checkpoint_with_foreign_values(tmp_path, tf.Variable(120, dtype=tf.int64))
  step = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(step=step, callbacks=checkpoints_lib.callbacks_node())
  restore(checkpoint, path)
  built_ins = _built_ins()
  checkpoints_lib.attach(checkpoint, built_ins, [], restored=path)
  assert int(step.numpy()) == 120
  fresh = _values(*built_ins)
  assert math.isnan(fresh[0]["best"]) and fresh[0]["evals_since"] == 0.0 and fresh[1] == 0
  saved = dict(tf.train.list_variables(checkpoint.save(str(tmp_path / "new"))))
  assert "callbacks/early_stopping/best/.ATTRIBUTES/VARIABLE_VALUE" in saved
  assert "callbacks/checkpointing/stopped_total_steps/.ATTRIBUTES/VARIABLE_VALUE" in saved
  assert not any(name.startswith("run/") for name in saved)


def test_callback_state_is_restored_where_a_checkpoint_holds_it_and_kept_where_not(tmp_path):
  checkpoint, step, stopping, checkpointing = _attached()
  stopping.checkpointed["best"].assign(0.5)
  checkpointing.stopped_total_steps.assign(40)
  step.assign(40)
  with_state = checkpoint.save(str(tmp_path / "with"))
  stopping.checkpointed["best"].assign(0.1)
  checkpointing.stopped_total_steps.assign(0)
  restore(checkpoint, with_state)  # mid-run (a NaN rollback): callbacks attached
  assert _values(stopping, checkpointing)[0]["best"] == 0.5 and _values(stopping, checkpointing)[1] == 40
  stopping.checkpointed["best"].assign(0.1)
  without = tf.train.Checkpoint(step=tf.Variable(30, dtype=tf.int64)).save(str(tmp_path / "without"))
  restore(checkpoint, without)  # a checkpoint older than the callbacks: no error, state kept
  assert int(step.numpy()) == 30 and stopping.checkpointed["best"].numpy() == pytest.approx(0.1)
  assert math.isnan(float(_built_ins()[0].checkpointed["best"].numpy()))  # a new callback starts afresh


def test_a_checkpoint_of_another_model_is_still_refused_with_callback_states_attached(tmp_path):
  other = tf.train.Checkpoint(step=tf.Variable(1, dtype=tf.int64)).save(str(tmp_path / "other"))
  checkpoint = tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), weights=tf.Variable([1.0, 2.0]),
                                   callbacks=checkpoints_lib.callbacks_node())
  checkpoints_lib.attach(checkpoint, _built_ins(), [])
  with pytest.raises(ConfigError, match=r"does not match this model/optimizer .*; use a new --workdir"):
    restore(checkpoint, other)
  assert "callbacks" in dict(checkpoint._trackable_children())  # put back after the refusal


def test_an_asynchronous_periodic_save_holds_the_callbacks_state(tmp_path):
  """TF's asynchronous writer saves what the checkpoint was constructed with: the callbacks/ node is made with it."""
  checkpoint, step, stopping, _ = _attached(10)
  stopping.checkpointed["best"].assign(0.75)
  saves = checkpoints_lib.Checkpoints(str(tmp_path), checkpoint, step, keep=2, is_chief=True, async_save=True)
  saves.save(10)  # asynchronous
  saves.close()
  saved = dict(tf.train.list_variables(saves.latest()))
  assert "callbacks/early_stopping/best/.ATTRIBUTES/VARIABLE_VALUE" in saved
  reader = tf.compat.v1.train.NewCheckpointReader(saves.latest())
  assert reader.get_tensor("callbacks/early_stopping/best/.ATTRIBUTES/VARIABLE_VALUE") == pytest.approx(0.75)
