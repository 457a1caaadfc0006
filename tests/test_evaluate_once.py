"""A chosen checkpoint evaluated once (loops/evaluate_once.py, mode=evaluate with eval.checkpoint): latest, best, a
step or a path gives the same numbers the training's eval gave at that step, in a JSON and under its own
TensorBoard tag; a checkpoint that is not there is one line before anything is written."""

import json
import os
import shutil

import pytest

from errors import ConfigError
from loops import rules
from loops import run
from tests.test_sidecar import event_scalars


@pytest.fixture(scope="module")
def trained(trained_digits):
  return trained_digits


def evaluated(trained, selector):
  config, workdir, _ = trained
  chosen = config.copy_and_resolve_references()
  chosen.mode, chosen.eval.checkpoint = "evaluate", selector
  return run.train_and_evaluate(chosen, workdir)


@pytest.mark.e2e
def test_a_step_latest_best_and_a_path_evaluate_that_checkpoint_as_the_training_did(trained):
  _, workdir, curve = trained
  best = json.load(open(f"{workdir}/best/best.json"))
  for name in os.listdir(f"{workdir}/checkpoints"):  # a copy under a name of the user's: its step is read from it
    if name.startswith("ckpt-10."):
      shutil.copy(f"{workdir}/checkpoints/{name}", f"{workdir}/kept.{name.split('.', 1)[1]}")
  for selector, step in (("10", 10), ("latest", 20), ("best", best["step"]),
                         (f"{workdir}/checkpoints/ckpt-10", 10), (f"{workdir}/kept", 10)):
    record = evaluated(trained, selector)
    assert record["step"] == step and record["eval/accuracy"] == pytest.approx(curve[step], abs=1e-6), selector
    assert json.load(open(f"{workdir}/eval/digits_test/checkpoint-{step}.json")) == pytest.approx(record), selector
    assert {"eval/loss", "eval/top5_accuracy"} <= set(record) and record["split"] == "test"
    assert record["input"] == "digits:test"
  assert event_scalars(f"{workdir}/eval/digits_test", "eval_checkpoint/accuracy") == pytest.approx(
      {10: curve[10], 20: curve[20]}, abs=1e-6)
  assert not os.path.exists(f"{workdir}/eval/evaluated.json")  # the sidecar's progress is left alone


@pytest.mark.e2e
def test_another_split_or_file_is_evaluated_beside_never_over_an_earlier_result(trained, tmp_path):
  config, workdir, _ = trained
  copy = str(tmp_path / "w")
  shutil.copytree(workdir, copy)
  chosen = config.copy_and_resolve_references()
  chosen.mode, chosen.eval.checkpoint = "evaluate", "10"
  on_test = run.train_and_evaluate(chosen, copy)
  chosen.data.eval_split = "train"
  on_train = run.train_and_evaluate(chosen, copy)
  assert on_train["input"] == "digits:train" and on_train["eval/accuracy"] != on_test["eval/accuracy"]
  assert json.load(open(f"{copy}/eval/digits_test/checkpoint-10.json")) == pytest.approx(on_test)
  assert json.load(open(f"{copy}/eval/digits_train/checkpoint-10.json")) == pytest.approx(on_train)
  # the result of another file of the same name is there: refused in one line, left as it was
  there = f"{copy}/eval/digits_train/checkpoint-10.json"
  with open(there, "w") as f:
    json.dump({"input": "npz:train in /elsewhere/digits.npz", "step": 10}, f)
  with pytest.raises(ConfigError, match=rf"^{there} holds the evaluation of 'npz:train in /elsewhere/digits.npz', "
                                        r"not of 'digits:train': remove it to evaluate this input$"):
    run.train_and_evaluate(chosen, copy)
  assert json.load(open(there)) == {"input": "npz:train in /elsewhere/digits.npz", "step": 10}


@pytest.mark.e2e
@pytest.mark.parametrize("selector, message", [
    ("15", r"^eval.checkpoint=15: no checkpoint of step 15 in .*/w/checkpoints \(steps: 10, 20\)$"),
    ("/nowhere/ckpt-3", r"^eval.checkpoint='/nowhere/ckpt-3' is neither 'latest', 'best', a step nor a checkpoint "
                        r"\(no /nowhere/ckpt-3.index\)$"),
])
def test_a_checkpoint_that_is_not_there_is_one_line_and_nothing_is_written(trained, selector, message):
  _, workdir, _ = trained
  before = sorted(os.listdir(f"{workdir}/eval")) if os.path.exists(f"{workdir}/eval") else []
  with pytest.raises(ConfigError, match=message):
    evaluated(trained, selector)
  assert (sorted(os.listdir(f"{workdir}/eval")) if os.path.exists(f"{workdir}/eval") else []) == before


def test_a_chosen_checkpoint_outside_mode_evaluate_is_refused():
  from tests.conftest import load_config
  config = load_config("digits_cnn")
  config.eval.checkpoint = "best"
  with pytest.raises(ConfigError, match=r"^eval.checkpoint='best' is read by mode=evaluate .*add --config.mode="
                                        r"evaluate$"):
    rules.check(config)


@pytest.mark.e2e
def test_a_dry_run_in_a_trained_workdir_names_the_checkpoint_it_would_resume_from(trained):
  config, workdir, _ = trained
  report = run.train_and_evaluate(config.copy_and_resolve_references(), workdir, dry_run=True)
  assert report["resumes_from"] == f"{workdir}/checkpoints/ckpt-20"
