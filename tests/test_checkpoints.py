"""loops/persist/checkpoints in-process: the owner's restores in their order; damaged checkpoints are skipped; the
manager someone holds is never replaced."""

import pytest
import os

import tensorflow as tf

from loops.persist import checkpoints as checkpoints_lib


def flip_a_byte(prefix):
  path = prefix + ".data-00000-of-00001"
  raw = bytearray(open(path, "rb").read())
  raw[len(raw) // 2] ^= 0xFF
  open(path, "wb").write(bytes(raw))


def series(workdir):
  weights = tf.Variable(tf.range(1000, dtype=tf.float32))
  step = tf.Variable(0, dtype=tf.int64)
  return weights, step, checkpoints_lib.Series(str(workdir), tf.train.Checkpoint(w=weights, step=step), step, keep=3,
                                               is_chief=True)


def test_a_damaged_checkpoint_is_set_aside_at_start_but_not_behind_the_back_of_a_manager_in_use(tmp_path):
  weights, step, checkpoints = series(tmp_path)
  for n in (10, 20):
    step.assign(n)
    weights.assign_add(tf.ones_like(weights))
    checkpoints.save(n)
  held = checkpoints.manager  # as the preemption handler holds it during a run
  flip_a_byte(os.path.join(checkpoints.directory, "ckpt-20"))
  assert checkpoints.restore_latest().endswith("ckpt-10") and int(step.numpy()) == 10  # a rollback mid-run
  assert checkpoints.manager is held and not os.path.exists(os.path.join(checkpoints.directory, "unreadable"))

  _, step, at_start = series(tmp_path)  # the next run: nobody holds its manager yet
  assert at_start.restore_latest().endswith("ckpt-10") and int(step.numpy()) == 10
  aside = sorted(os.listdir(os.path.join(at_start.directory, "unreadable")))
  assert aside == ["ckpt-20.data-00000-of-00001", "ckpt-20.index"]
  assert at_start.latest().endswith("ckpt-10")


def test_a_non_chief_saves_into_its_own_scratch_directory_keeps_one_and_removes_what_dead_tasks_left(tmp_path):
  import socket
  import subprocess
  import sys
  host = socket.gethostname()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  left_by_dead = tmp_path / f"ckpt-nonchief-{host}-{int(dead.stdout)}-abc"
  live = tmp_path / f"ckpt-nonchief-{host}-{os.getpid()}-def"  # a task of this process (alive): kept
  other_host = tmp_path / f"ckpt-nonchief-{host}x-{int(dead.stdout)}-ghi"  # another host's: never ours to judge
  for directory in (left_by_dead, live, other_host):
    directory.mkdir()
    (directory / "ckpt-1.index").write_text("x")
  scratch = checkpoints_lib.scratch_directory(root=str(tmp_path))
  assert not left_by_dead.exists() and live.exists() and other_host.exists()
  assert os.path.basename(scratch).startswith(f"ckpt-nonchief-{host}-{os.getpid()}-")

  step = tf.Variable(0, dtype=tf.int64)
  non_chief = checkpoints_lib.Series(str(tmp_path / "workdir"), tf.train.Checkpoint(step=step), step, keep=3,
                                     is_chief=False)
  for n in (10, 20, 30):
    step.assign(n)
    assert non_chief.save(n) is None
  own = non_chief._temporary  # pylint: disable=protected-access
  assert sorted(f for f in os.listdir(own) if f.endswith(".index")) == ["ckpt-30.index"]
  assert not (tmp_path / "workdir").exists()
  non_chief.close()
  assert not os.path.exists(own)


def run_parts(learning_rate):
  """A one-layer model, its SGD optimizer (a constant learning rate: a variable the checkpoint holds) and the step
  counter, as the owner reads them off build.Parts."""
  import types
  import keras
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  optimizer = keras.optimizers.SGD(learning_rate)
  optimizer.build(model.trainable_variables)
  step = tf.Variable(0, dtype=tf.int64)
  checkpoint = checkpoints_lib.holding({"model": model}, {"model": optimizer}, step)
  return types.SimpleNamespace(checkpoint=checkpoint, step_counter=step, role=types.SimpleNamespace(is_chief=True),
                               main_model=model, main_optimizer=optimizer, optimizers={"model": optimizer},
                               learning_rates={"model": 0.3}, strategy=tf.distribute.get_strategy())


def _stopping(best):
  from loops import callbacks as callbacks_lib
  stopping = callbacks_lib.EarlyStopping("eval/loss", "min", 3, 0.0)
  stopping.checkpointed["best"].assign(best)
  return stopping


def _seen(parts, stopping):
  """(step, the callback's best, the learning rate) as the run sees them now."""
  return (int(parts.step_counter.numpy()), float(stopping.checkpointed["best"].numpy()),
          round(float(parts.main_optimizer.learning_rate), 6))


def test_the_owner_restores_the_latest_else_warm_starts_then_callbacks_preemption_and_learning_rates_last(
    tmp_path, caplog):
  from errors import ConfigError
  from configs import settings
  from tests.conftest import load_config
  config = load_config("digits_cnn")
  config.checkpoint.best_metric = ""
  config.init.checkpoint = str(tmp_path / "no-such-run")
  read = settings.read(config)
  owner = lambda parts: checkpoints_lib.Checkpoints.for_run(read.checkpoint, read.init, read.run.strategy,
                                                            str(tmp_path), parts, twin=None)
  first = run_parts(0.1)
  never = lambda _: pytest.fail("the preemption handler was made after a refusal")
  with pytest.raises(ConfigError, match="init.checkpoint .*no-such-run' does not exist"):
    owner(first).restore_run([], [], never)  # a new run
  saves = owner(first)
  checkpoints_lib.attach(first.checkpoint, [_stopping(0.5)], [])
  first.step_counter.assign(7)
  saves.save(7, wait=True)
  saves.close()

  resumed, stopping, made = run_parts(0.5), _stopping(0.9), []
  checkpoints = owner(resumed)
  handler = lambda owner: made.append((owner, _seen(resumed, stopping))) or "watcher"
  restored = checkpoints.restore_run([stopping], [], handler)
  assert restored.path.endswith("ckpt-7") and (restored.warm_start_table, restored.warm_start_counts) == ("", {})
  assert "no-such-run' is ignored" in caplog.text  # a resumed run ignores init.checkpoint
  assert made == [(checkpoints, (7, 0.5, 0.1))]  # made after the callbacks' state, before the learning rates
  assert restored.preemption == "watcher" and _seen(resumed, stopping) == (7, 0.5, 0.3)

  resumed.step_counter.assign(9)
  stopping.checkpointed["best"].assign(0.2)
  assert checkpoints.roll_back().endswith("ckpt-7")  # a NaN rollback to the checkpoint of the run before
  assert _seen(resumed, stopping) == (7, 0.5, 0.3) and len(made) == 1  # this run's learning rate, not 0.1
  checkpoints.close()


def test_an_evaluator_restores_a_readable_checkpoint_and_is_told_why_another_is_not(tmp_path):
  weights, step, checkpoints = series(tmp_path)
  step.assign(10)
  path = checkpoints.save(10)
  step.assign(0)
  checkpoint = tf.train.Checkpoint(w=weights, step=step)
  assert checkpoints_lib.Checkpoints.restore_to_evaluate(checkpoint, path) is None and int(step.numpy()) == 10
  flip_a_byte(path)
  step.assign(0)
  assert "Checksum does not match" in checkpoints_lib.Checkpoints.restore_to_evaluate(checkpoint, path)
  assert int(step.numpy()) == 0  # nothing restored


def test_a_best_checkpoint_and_its_steps_periodic_one_hold_the_same_values(tmp_path):
  """same_values: the weights alike though the series' save counters differ; one value changed is not alike."""
  weights, step, checkpoints = series(tmp_path / "periodic")
  checkpoint = tf.train.Checkpoint(w=weights, step=step)
  best = checkpoints_lib.Series(str(tmp_path / "w"), checkpoint, step, keep=1, is_chief=True, subdir="best")
  step.assign(20)
  checkpoints.save(10)
  periodic, kept = checkpoints.save(20), best.save(20)
  assert checkpoints_lib.same_values(periodic, kept)
  weights.assign_add(tf.one_hot(999, 1000))
  assert not checkpoints_lib.same_values(periodic, checkpoints.save(30))
  assert not checkpoints_lib.same_values(periodic, str(tmp_path / "none" / "ckpt-20"))


def test_only_the_owner_makes_checkpoints_and_their_managers():
  import re
  from tests.conftest import REPO
  makers = re.compile(r"\b(tf\.train\.Checkpoint|CheckpointManager|tf\.compat\.v1\.train\.update_checkpoint_state)\(")
  found = set()
  for root, _, files in os.walk(os.path.join(REPO, "loops")):
    for name in files:
      path = os.path.join(root, name)
      if name.endswith(".py") and makers.search(open(path).read()):
        found.add(os.path.relpath(path, REPO).replace(os.sep, "/"))
  assert found == {"loops/persist/checkpoints.py"}
