"""User callbacks, early stopping and custom eval metrics, end to end on one_device, mirrored x2 and 2-worker MWMS.

The callback and metric modules live outside the framework (tests/fixtures/plugins, put on the path like a user's
own folder) and are named only by config strings.
"""

import json
import os
import sys

import pytest

from loops import run
from tests.conftest import REPO, load_config, pythonpath, run_command
from tests.test_train import scalars

PLUGINS = os.path.join(REPO, "tests", "fixtures", "plugins")
CUSTOM = ("accuracy", "top5_accuracy", "my_callbacks:mean_abs_logit", "my_callbacks:balanced_error")


@pytest.fixture
def plugins(monkeypatch):
  monkeypatch.syspath_prepend(PLUGINS)
  monkeypatch.delenv("STOP_ON_WORKER", raising=False)
  monkeypatch.setenv("STOP_AT_STEP", "10")


def plugged(tiny_digits, strategy="one_device"):
  """tiny_digits (20 steps, 5 per call) with a recorder callback, two custom metrics and a best checkpoint by one."""
  c = tiny_digits
  c.strategy, c.cpu_replicas = strategy, 2 if strategy == "mirrored" else 0
  c.optimizer.momentum = 0.0
  c.callbacks = ("my_callbacks:recorder",)
  c.eval.metrics = CUSTOM
  c.checkpoint.best_metric, c.checkpoint.best_mode = "eval/error_rate", "min"
  return c


def test_a_user_callback_sees_every_hook_with_the_loops_values_and_writes_scalars(plugins, tiny_digits, tmp_path):
  import my_callbacks
  extra = my_callbacks.Recorder(None)  # a Python caller can pass objects too
  summary = run.train_and_evaluate(plugged(tiny_digits), str(tmp_path), callbacks=[extra])
  hooks = [(e["hook"], e["step"]) for e in extra.seen]
  assert hooks == [("on_train_begin", 0), ("after_train_call", 5), ("after_train_call", 10), ("after_eval", 10),
                   ("after_train_call", 15), ("after_train_call", 20), ("after_eval", 20), ("on_train_end", 20)]
  first_call, first_eval = extra.seen[1], extra.seen[3]
  assert first_call["eval"] == {} and set(first_call["train"]) == {"train/loss", "train/accuracy"}
  assert first_call["epoch"] == pytest.approx(5 / 22) and first_call["total_steps"] == 20 and first_call["is_chief"]
  assert set(first_eval["eval"]) == {"eval/loss", "eval/accuracy", "eval/top5_accuracy", "eval/mean_abs_logit",
                                     "eval/error_rate"}
  assert extra.seen[-1]["eval"]["eval/error_rate"] == pytest.approx(summary["eval/error_rate"])
  values, _ = scalars(str(tmp_path))
  written = values["custom/steps_seen"]  # by both recorders (the config's and the object)
  assert sorted(written) == [(s, float(s)) for s in (5, 5, 10, 10, 15, 15, 20, 20)]


@pytest.mark.e2e
def test_custom_metrics_report_everywhere_and_drive_the_best_checkpoint(plugins, tiny_digits, tmp_path):
  summary = run.train_and_evaluate(plugged(tiny_digits), str(tmp_path))
  assert summary["eval/error_rate"] == pytest.approx(1.0 - summary["eval/accuracy"], abs=1e-6)
  assert summary["eval/mean_abs_logit"] > 0
  assert summary["best_metric"] == "eval/error_rate"
  errors = [v for _, v in scalars(str(tmp_path))[0]["eval/error_rate"]]
  assert summary["best_value"] == pytest.approx(min(errors))
  on_disk = json.load(open(tmp_path / "summary.json"))
  assert on_disk["eval/mean_abs_logit"] == pytest.approx(summary["eval/mean_abs_logit"])


@pytest.mark.e2e
def test_a_custom_metric_agrees_on_one_device_mirrored_and_two_mwms_workers_and_a_stop_on_worker_1_stops_both(
    plugins, tiny_digits, tmp_path):
  """MWMS: worker 1 alone asks to stop at step 10; both workers stop there (no hang), evaluate, save, exit 0."""
  results = {}
  for strategy in ("one_device", "mirrored"):
    c = plugged(tiny_digits, strategy)
    c.train.steps = 10
    results[strategy] = run.train_and_evaluate(c, str(tmp_path / strategy))
  workdir = tmp_path / "mwms"
  command = [sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
             "--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.strategy=multi_worker_mirrored",
             "--config.train.steps=20", "--config.train.steps_per_loop=5", "--config.eval.every_steps=10",
             "--config.checkpoint.every_steps=10", "--config.optimizer.momentum=0.0", "--config.summary.progress_bar=off",
             "--config.callbacks=('my_callbacks:recorder', 'my_callbacks:stop_at')", f"--config.eval.metrics={CUSTOM}",
             "--config.checkpoint.best_metric=eval/error_rate", "--config.checkpoint.best_mode=min"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env.update(PYTHONPATH=pythonpath(PLUGINS), STOP_ON_WORKER="1", STOP_AT_STEP="10", RECORD_HOOKS=str(tmp_path / "hooks.jsonl"))
  done = run_command(command, env=env, timeout=400)
  assert done.returncode == 0, done.stdout[-3000:]
  summary = json.load(open(workdir / "summary.json"))
  assert summary["step"] == 10 and summary["stopped_early"] == "asked by StopAt on worker 1 at step 10"
  hooks = [json.loads(line) for line in open(tmp_path / "hooks.jsonl")]
  ends = [(h["is_chief"], h["step"]) for h in hooks if h["hook"] == "on_train_end"]
  assert sorted(ends) == [(False, 10), (True, 10)]  # both workers ended at step 10
  for name in ("eval/mean_abs_logit", "eval/error_rate", "eval/loss"):
    for strategy in ("mirrored", "one_device"):
      assert summary[name] == pytest.approx(results[strategy][name], abs=1e-4), (name, strategy)

  again = run_command(command, env=env, timeout=400)
  assert again.returncode == 0, again.stdout[-3000:]
  assert "this run stopped early at step 10 (asked by StopAt on worker 1 at step 10): not training further" \
         in again.stdout
  assert json.load(open(workdir / "summary.json"))["step"] == 10


EARLY = ["--config=configs/digits_cnn.py", "--config.eval.every_steps=50",
         "--config.checkpoint.every_steps=100", "--config.early_stopping.metric=eval/loss",
         "--config.early_stopping.patience=3", "--config.deterministic=True", "--config.summary.progress_bar=off",
         "--config.export=False"]


def main_py(workdir, *args):
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  result = run_command([sys.executable, "main.py", *EARLY, f"--workdir={workdir}", *args], env=env, timeout=400)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.load(open(os.path.join(workdir, "summary.json"))), result.stderr


@pytest.mark.e2e
def test_early_stopping_stops_digits_well_before_3000_steps_and_its_state_survives_a_resume(tmp_path):
  straight, _ = main_py(tmp_path / "straight", "--config.train.steps=3000")
  stop = straight["step"]
  assert stop <= 1500 and straight["stopped_early"].startswith("early stopping: eval/loss did not improve by more "
                                                               "than 0.0 in 3 evals (best ")
  assert straight["eval/accuracy"] >= 0.95
  assert straight["early_stopping_best_step"] == stop - 3 * 50
  # The same run in two lives: stopped (as by a preemption) after one eval without improvement, then resumed.
  first, _ = main_py(tmp_path / "resumed", f"--config.train.steps={stop - 100}")
  assert "stopped_early" not in first
  resumed, log = main_py(tmp_path / "resumed", "--config.train.steps=3000")
  assert f"restored {tmp_path / 'resumed'}/checkpoints/ckpt-{stop - 100}" in log
  assert resumed["step"] == stop and resumed["stopped_early"] == straight["stopped_early"]
  assert resumed["eval/loss"] == straight["eval/loss"]  # deterministic: the resumed run is the same run


class EvalCounter:
  """Counts evals over the whole run: its count is checkpointed (the `checkpointed` attribute)."""

  def __init__(self):
    import tensorflow as tf
    self.checkpointed = {"evals": tf.Variable(0, dtype=tf.int64, trainable=False)}

  def after_eval(self, state):
    self.checkpointed["evals"].assign_add(1)

  def on_train_end(self, state):
    state.summary["evals_counted"] = int(self.checkpointed["evals"].numpy())


@pytest.mark.e2e
def test_a_callbacks_checkpointed_state_survives_a_resume_and_starts_afresh_on_a_new_run(tiny_digits, tmp_path):
  c = tiny_digits  # 20 steps, an eval every 5: 4 evals
  c.eval.every_steps, c.checkpoint.every_steps = 5, 5
  c.export = False  # what is asserted is the callback's count and the step (an export is 1-2 s a run)
  first = run.train_and_evaluate(c, str(tmp_path / "w"), callbacks=[EvalCounter()])
  assert first["evals_counted"] == 4
  c.train.steps = 40  # the same run, longer: resumes at step 20 with a new callback object (as a new process)
  resumed = run.train_and_evaluate(c, str(tmp_path / "w"), callbacks=[EvalCounter()])
  assert resumed["step"] == 40 and resumed["evals_counted"] == 8  # 4 restored + 4 more
  fresh = run.train_and_evaluate(c, str(tmp_path / "other"), callbacks=[EvalCounter()])
  assert fresh["evals_counted"] == 8  # 40 steps from scratch
  plain = run.train_and_evaluate(c, str(tmp_path / "w"))  # resumed without it: the run still restores
  assert plain["step"] == 40
