"""loops/sidecar.py: the sidecar evaluator, in-process after a run, and beside MWMS and parameter-server jobs
started by launch.local --evaluator."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from errors import ConfigError
from loops import run
from loops import sidecar
from tests.conftest import REPO

PY = sys.executable


def write_json(path, value):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f)


def test_the_final_checkpoint_is_the_plans_last_step_or_where_an_early_stop_ended(tmp_path):
  workdir = str(tmp_path)
  assert not sidecar.is_final(workdir, 100)  # no plan yet: the training has not started
  write_json(f"{workdir}/plan.json", {"total_steps": 100})
  assert not sidecar.is_final(workdir, 80) and sidecar.is_final(workdir, 100)
  write_json(f"{workdir}/summary.json", {"step": 80, "total_steps": 100, "stopped_early": "early stopping: ..."})
  assert sidecar.is_final(workdir, 80) and not sidecar.is_final(workdir, 60)
  write_json(f"{workdir}/plan.json", {"total_steps": 120})  # the early-stopped run continued to 120 steps
  assert not sidecar.is_final(workdir, 80) and sidecar.is_final(workdir, 120)
  write_json(f"{workdir}/summary.json", {"step": 80})  # an earlier, shorter run that ended normally
  assert not sidecar.is_final(workdir, 80)


def event_scalars(directory, tag):
  """{step: value} of a scalar tag in the TensorBoard event files of directory (not its subdirectories)."""
  values = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = float(tf.make_ndarray(value.tensor))
  return values


@pytest.mark.e2e
def test_an_evaluator_after_a_run_evaluates_each_checkpoint_once_and_matches_the_trainers_eval(tiny_digits, tmp_path,
                                                                                              caplog):
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.INFO)
  workdir = str(tmp_path / "w")
  tiny_digits.export = False  # the evaluator is compared by its evals (an export is 1-2 s a run)
  trained = run.train_and_evaluate(tiny_digits, workdir)  # eval at 10 and 20, checkpoints at 10 and 20
  assert "train input: device-resident" in caplog.text
  caplog.clear()
  tiny_digits.mode = "evaluate"
  tiny_digits.eval.sidecar_poll_seconds = 0.1
  evaluated = run.train_and_evaluate(tiny_digits, workdir)
  assert "train input:" not in caplog.text  # an evaluator neither places nor streams the train split
  assert evaluated["step"] == 20
  for key in ("eval/loss", "eval/accuracy", "eval/top5_accuracy"):
    assert evaluated[key] == pytest.approx(trained[key], abs=1e-6), key
  trainer_curve = event_scalars(workdir, "eval/accuracy")
  evaluator_curve = event_scalars(f"{workdir}/eval", "eval/accuracy")
  assert sorted(evaluator_curve) == [10, 20]
  for step in (10, 20):
    assert evaluator_curve[step] == pytest.approx(trainer_curve[step], abs=1e-6)
  best = json.load(open(f"{workdir}/eval/best/best.json"))
  assert best["value"] == max(evaluator_curve.values()) and best["step"] == evaluated["best_step"]
  assert tf.train.latest_checkpoint(f"{workdir}/eval/best").endswith(f"ckpt-{best['step']}")

  again = run.train_and_evaluate(tiny_digits, workdir)  # a restarted evaluator: nothing new, done at once
  assert again["step"] == 20 and again["eval/accuracy"] == evaluated["eval/accuracy"]
  assert sorted(event_scalars(f"{workdir}/eval", "eval/accuracy")) == [10, 20]

  tiny_digits.mode, tiny_digits.train.steps = "train", 30  # the training extended: its new checkpoint is evaluated
  longer = run.train_and_evaluate(tiny_digits, workdir)
  tiny_digits.mode = "evaluate"
  extended = run.train_and_evaluate(tiny_digits, workdir)
  assert extended["step"] == 30 and extended["eval/accuracy"] == pytest.approx(longer["eval/accuracy"], abs=1e-6)
  assert sorted(event_scalars(f"{workdir}/eval", "eval/accuracy")) == [10, 20, 30]


def test_an_evaluator_without_checkpoints_says_what_it_waits_for_and_gives_up_after_its_timeout(
    tiny_digits, tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(sidecar, "WAITING_LOG_SECONDS", 0.4)
  caplog.set_level("INFO")
  tiny_digits.mode = "evaluate"
  tiny_digits.eval.sidecar_poll_seconds = 0.1
  tiny_digits.eval.sidecar_timeout_seconds = 1.0
  with pytest.raises(ConfigError, match=r"evaluator: no new checkpoint in .*/checkpoints for 1 s \(eval.sidecar_"
                                        r"timeout_seconds; last evaluated step -1\); is the training running\?"):
    run.train_and_evaluate(tiny_digits, str(tmp_path))
  waiting = [r.getMessage() for r in caplog.records if "evaluator: waiting for" in r.getMessage()]
  assert 2 <= len(waiting) <= 3, waiting  # at 0 s, ~0.4 s, ~0.8 s: a steady interval, not once per poll
  assert waiting[0].startswith(f"evaluator: waiting for the first checkpoint in {tmp_path}/checkpoints (0 s so far; "
                               "gives up after 1 s")


JOB = ["--config=configs/digits_cnn.py", "--config.train.steps=60",
       "--config.train.steps_per_loop=10", "--config.checkpoint.every_steps=20", "--config.eval.every_steps=0",
       "--config.summary.progress_bar=off", "--config.export=False", "--config.eval.sidecar_poll_seconds=0.5",
       "--config.eval.sidecar_timeout_seconds=240"]


@pytest.mark.e2e
@pytest.mark.parametrize("strategy, launcher", [
    ("multi_worker_mirrored", ["--workers=2"]),
    ("parameter_server", ["--workers=2", "--ps=1"]),
])
def test_a_sidecar_beside_a_multi_process_job_evaluates_every_checkpoint_and_ends_with_it(tmp_path, strategy,
                                                                                          launcher):
  workdir = tmp_path / "job"
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  result = subprocess.run([PY, "-m", "launch.local", *launcher, "--evaluator", "--", PY, "main.py", *JOB,
                           f"--workdir={workdir}", f"--config.strategy={strategy}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-4000:]
  evaluated = re.findall(r"\[evaluator:0\].*evaluated \S+/checkpoints/ckpt-(\d+) \(step (\d+)", result.stdout)
  assert [int(s) for _, s in evaluated] == [20, 40, 60], result.stdout[-4000:]  # each once, in order
  assert re.search(r"\[evaluator:0\].*evaluated \S+ckpt-60 \(step 60, final\)", result.stdout)
  trained = json.load(open(workdir / "summary.json"))
  progress = json.load(open(workdir / "eval" / "evaluated.json"))
  assert progress["final"] and progress["step"] == trained["step"] == 60
  assert progress["eval"]["eval/accuracy"] == pytest.approx(trained["eval/accuracy"], abs=1e-6)
  assert progress["eval"]["eval/loss"] == pytest.approx(trained["eval/loss"], abs=1e-5)
  assert sorted(event_scalars(str(workdir / "eval"), "eval/loss")) == [20, 40, 60]
  assert (workdir / "eval" / "best" / "best.json").exists()
