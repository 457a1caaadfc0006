"""Faults found by trying the framework as users do: Ctrl-C, late signals, a finished run rerun, mistakes in user
code and config files. Each runs main.py as a user would and checks the exit code, the one error line and what is
left in the workdir."""

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO, pythonpath, run_main

PLUGINS = os.path.join(REPO, "tests", "fixtures", "plugins")
SHORT = ["--config=configs/digits_cnn.py", "--config.train.steps_per_loop=5", "--config.summary.progress_bar=off"]


def main_with_plugins(workdir, *flags, env=None, timeout=300):
  return run_main(*SHORT, f"--workdir={workdir}", *flags, env={"PYTHONPATH": pythonpath(PLUGINS), **(env or {})},
                  timeout=timeout)


def error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def checkpoint_steps(workdir):
  names = os.listdir(os.path.join(workdir, "checkpoints"))
  return sorted(int(m.group(1)) for m in map(re.compile(r"ckpt-(\d+)\.index$").match, names) if m)


@pytest.mark.e2e
def test_ctrl_c_saves_at_the_end_of_the_call_and_exits_130_with_one_line(tmp_path):
  done = main_with_plugins(tmp_path, "--config.train.steps=400", "--config.callbacks=('my_callbacks:ctrl_c_at_step_10',)")
  assert done.returncode == 130, done.stderr[-2000:]
  assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
  steps = checkpoint_steps(tmp_path)
  assert steps and 10 <= steps[-1] < 400
  assert re.search(r"interrupted \(Ctrl-C\): checkpoint saved; exiting with code 130; rerun the same command to "
                   r"resume from .*ckpt-%d" % steps[-1], done.stderr)
  again = main_with_plugins(tmp_path, "--config.train.steps=400")
  assert again.returncode == 0 and f"restored {tmp_path}/checkpoints/ckpt-{steps[-1]}" in again.stderr


@pytest.mark.e2e
def test_a_second_ctrl_c_exits_at_once(tmp_path):
  done = main_with_plugins(tmp_path, "--config.train.steps=400", "--config.checkpoint.every_steps=0",
                           "--config.callbacks=('my_callbacks:ctrl_c_at_step_10',)", env={"CTRL_C_TWICE": "1"})
  assert done.returncode == 130
  assert "second Ctrl-C: exiting at once" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.e2e
def test_signals_after_the_last_step_leave_a_finished_run_finished(tmp_path):
  """A scheduler's late SIGUSR1 used to kill the finished run (138) or turn it into a preemption (143)."""
  done = main_with_plugins(tmp_path, "--config.train.steps=10", "--config.preemption.signals=SIGTERM,SIGUSR1",
                           "--config.callbacks=('my_callbacks:signals_after_training',)")
  assert done.returncode == 0, done.stderr[-2000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["step"] == 10 and summary["train/loss"] > 0


@pytest.mark.e2e
def test_a_rerun_of_a_finished_run_keeps_its_summary(tmp_path):
  main_with_plugins(tmp_path, "--config.train.steps=10")
  first = json.loads((tmp_path / "summary.json").read_text())
  again = main_with_plugins(tmp_path, "--config.train.steps=10")
  assert again.returncode == 0 and "the run was complete at step 10" in again.stderr
  second = json.loads((tmp_path / "summary.json").read_text())
  for key in ("train/loss", "train/accuracy", "train_seconds", "examples_per_sec", "wall_seconds"):
    assert second[key] == first[key], key
  assert second["eval/accuracy"] == pytest.approx(first["eval/accuracy"], abs=1e-6)


@pytest.mark.e2e
def test_an_error_in_a_users_callback_names_its_file_and_line(tmp_path):
  done = main_with_plugins(tmp_path, "--config.train.steps=10", "--config.callbacks=('my_callbacks:buggy_callback',)")
  assert done.returncode == 1
  source = os.path.join(PLUGINS, "my_callbacks.py")
  line = next(n for n, text in enumerate(open(source), 1) if 'state.eval["eval/acc"]' in text)
  assert error_lines(done.stderr) == [f"error: callback Buggy.after_eval raised KeyError: 'eval/acc' (in {source}:{line})"]


@pytest.mark.e2e
def test_a_users_callback_raising_after_steps_were_trained_saves_them_and_stops_with_one_line(tmp_path):
  done = main_with_plugins(tmp_path, "--config.train.steps=400", "--config.checkpoint.every_steps=0",
                           "--config.callbacks=('my_callbacks:raises_at_step_20',)")
  assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
  source = os.path.join(PLUGINS, "my_callbacks.py")
  line = next(n for n, text in enumerate(open(source), 1) if "raise RuntimeError(f\"cannot go on" in text)
  assert error_lines(done.stderr) == [f"error: callback FailsLate.after_train_call raised RuntimeError: cannot go on at "
                                      f"step 20 (in {source}:{line})"]
  assert "the 20 steps trained since the last checkpoint are saved in" in done.stderr
  assert checkpoint_steps(tmp_path) == [20]
  again = main_with_plugins(tmp_path, "--config.train.steps=30")
  assert again.returncode == 0 and f"restored {tmp_path}/checkpoints/ckpt-20" in again.stderr


@pytest.mark.e2e
def test_callback_state_a_checkpoint_cannot_hold_or_restore_is_one_line_naming_the_callback(tmp_path):
  counting = "--config.callbacks=('my_callbacks:counting',)"
  plain = main_with_plugins(tmp_path / "plain", "--config.train.steps=10", counting, env={"COUNTER_KIND": "plain"})
  assert plain.returncode == 1 and not (tmp_path / "plain" / "checkpoints").exists()
  assert error_lines(plain.stderr) == ["error: callback 'my_callbacks:counting': checkpointed['calls'] is a int, which "
                                       "a checkpoint does not save: make it a tf.Variable (e.g. tf.Variable(0))"]
  first = main_with_plugins(tmp_path / "w", "--config.train.steps=10", counting)
  assert first.returncode == 0, first.stderr[-2000:]
  for kind, now in (("vector", "int64 [2]"), ("float", "float32 []")):
    again = main_with_plugins(tmp_path / "w", "--config.train.steps=20", counting, env={"COUNTER_KIND": kind})
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert error_lines(again.stderr) == [
        f"error: callback Counting: its checkpointed 'calls' is {now} here but int64 [] in "
        f"{tmp_path}/w/checkpoints/ckpt-10: keep its dtype and shape, or give the new one another name (a name new "
        "to the checkpoint starts afresh)"]
  assert checkpoint_steps(tmp_path / "w") == [10]


BAD_INPUT = ["--config.data.name=bad_input:batches", "--config.task.name=bad_input:Sign",
             "--config.train.global_batch_size=32", "--config.checkpoint.best_metric=", "--config.checkpoint.every_steps=0"]


@pytest.mark.e2e
def test_an_input_function_raising_mid_epoch_is_one_line_and_the_steps_before_it_are_saved(tmp_path):
  # The rows read ahead after the failing one take a second each: the process exits with calls into Python still
  # running, and must still end (loops/run.py frees the iterators before finalization; freed later, they hang).
  done = main_with_plugins(tmp_path, *BAD_INPUT, "--config.train.steps=60", env={"BAD": "raise"}, timeout=90)
  assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
  source = os.path.join(PLUGINS, "bad_input.py")
  line = next(n for n, text in enumerate(open(source), 1) if "raise ValueError" in text)
  assert error_lines(done.stderr) == [f"error: data.name='bad_input:batches': reading the train batch of step 5 "
                                      f"failed: ValueError: row with value 2.23 is out of range (in {source}:{line})"]
  assert checkpoint_steps(tmp_path) == [4]  # the row is in the fifth batch: four steps trained on good batches
  again = main_with_plugins(tmp_path, *BAD_INPUT, "--config.train.steps=10")
  assert again.returncode == 0 and f"restored {tmp_path}/checkpoints/ckpt-4" in again.stderr


@pytest.mark.e2e
def test_an_input_function_yielding_short_batches_is_one_line_and_saves_nothing(tmp_path):
  done = main_with_plugins(tmp_path, *BAD_INPUT, "--config.train.steps=60", env={"BAD": "short"})
  assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
  lines = error_lines(done.stderr)
  assert len(lines) == 1 and lines[0].startswith("error: data.name='bad_input:batches': a train batch is not as long "
                                                 "as the batch_size it was asked for (found after step ")
  assert not (tmp_path / "checkpoints").exists() or checkpoint_steps(tmp_path) == []


@pytest.mark.e2e
def test_a_metric_that_cannot_take_the_runs_call_is_refused_before_training(tmp_path):
  done = main_with_plugins(tmp_path, "--config.train.steps=10", "--config.eval.metrics=('my_callbacks:count_only',)")
  assert done.returncode == 1
  source = os.path.join(PLUGINS, "my_callbacks.py")
  line = next(n for n, text in enumerate(open(source), 1) if "def update_state(self, labels):" in text)
  assert error_lines(done.stderr) == [f"error: eval.metrics entry 'my_callbacks:count_only': CountOnly.update_state"
                                      f"(labels) ({source}:{line}) must take (labels, logits, sample_weight=None)"]
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.e2e
def test_a_misspelled_key_in_a_config_file_is_refused(tmp_path):
  config = tmp_path / "typo.py"
  config.write_text("from configs import digits_cnn\n\n\ndef get_config(arg=None):\n  c = digits_cnn.get_config(arg)\n"
                    "  c.optimizer.learning_rat = 0.5\n  return c\n")
  done = run_main(f"--config={config}", f"--workdir={tmp_path / 'run'}")
  assert done.returncode == 1
  assert error_lines(done.stderr) == [f"error: {config} sets 'learning_rat', a key configs/base.py does not define "
                                      "(did you mean 'learning_rate'?); a config file may only set existing keys "
                                      "(model.kwargs, loss.kwargs and task.kwargs take any)"]
  assert not (tmp_path / "run").exists()


@pytest.fixture
def small_disk(tmp_path):
  """A 3 MB tmpfs (two digits checkpoints of 1.2 MB fit, a third does not); needs root, as CI and dev machines run."""
  mount = tmp_path / "small"
  mount.mkdir()
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True,
                           text=True)
  if mounted.returncode:
    pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {mounted.stderr.strip()}")
  yield mount
  subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.e2e
def test_a_full_disk_is_one_line_and_the_last_checkpoint_resumes(small_disk, tmp_path):
  workdir = small_disk / "run"
  done = main_with_plugins(workdir, "--config.train.steps=100", "--config.checkpoint.every_steps=10")
  assert done.returncode == 1
  assert error_lines(done.stderr) == [
      f"error: no space left on the device of {workdir}/checkpoints/ckpt-30_temp: free some space (or move the "
      "workdir) and rerun the same command; it resumes from the last complete checkpoint (a save that failed is "
      "never read)"]
  assert "Traceback" not in done.stderr and checkpoint_steps(workdir) == [10, 20]
  moved = tmp_path / "moved"
  shutil.copytree(workdir, moved)
  again = main_with_plugins(moved, "--config.train.steps=40", "--config.checkpoint.every_steps=10")
  assert again.returncode == 0 and "restored" in again.stderr and "ckpt-20" in again.stderr


@pytest.mark.e2e
def test_an_error_in_a_users_loss_while_traced_names_its_file_and_line(tmp_path):
  losses = os.path.join(REPO, "tests", "fixtures", "user_losses")
  done = run_main(*SHORT, f"--workdir={tmp_path}", "--config.train.steps=10",
                  "--config.loss.name=my_losses:breaks_when_traced", env={"PYTHONPATH": pythonpath(losses)})
  source = os.path.join(losses, "my_losses.py")
  line = next(n for n, text in enumerate(open(source), 1) if "raise ValueError(\"a bug in the user's loss\")" in text)
  assert done.returncode == 1
  assert error_lines(done.stderr) == [f"error: a bug in the user's loss (in {source}:{line}) (rerun with --debug for "
                                      "the traceback)"]
