"""Changes on resume: the record of starts (workdir/starts.jsonl), what stops a resume, what it keeps."""

import json

import pytest

from errors import ConfigError
from loops import run
from loops.persist import starts
from tests.test_research import assert_same, configured, mwms, trained
from tests.test_sidecar import event_scalars
from tests.conftest import run_main


def test_settings_of_the_optimisation_need_acceptance_and_the_others_do_not():
  recorded = {"optimizer.learning_rate": 0.05, "seed": 0, "train.steps": 20, "eval.every_steps": 10,
              "data.data_dir": "/a", "model.kwargs.width": 8}
  now = {"optimizer.learning_rate": 0.5, "seed": 1, "train.steps": 40, "eval.every_steps": 5, "data.data_dir": "/b",
         "model.kwargs.depth": 2, "model.kwargs.width": 8}
  refused, accepted = starts.compare(recorded, now)
  assert refused == [("model.kwargs.depth", starts.ABSENT, 2), ("optimizer.learning_rate", 0.05, 0.5), ("seed", 0, 1)]
  assert accepted == [("data.data_dir", "/a", "/b"), ("eval.every_steps", 10, 5), ("train.steps", 20, 40)]
  assert starts.describe(refused) == "model.kwargs.depth: (absent) -> 2, optimizer.learning_rate: 0.05 -> 0.5, seed: 0 -> 1"
  assert starts.is_accepted("checkpoint.keep") and not starts.is_accepted("checkpointing") and not starts.is_accepted(
      "train.global_batch_size")


def test_the_plan_keeps_the_recorded_batch_and_rate_unless_their_settings_changed():
  recorded = {"plan": {"global_batch_size": 32, "learning_rate": 0.05, "replicas": 1}}
  assert starts.kept_plan_values(recorded, ["train.steps"]) == {"global_batch_size": 32, "learning_rate": 0.05}
  assert starts.kept_plan_values(recorded, ["optimizer.learning_rate"]) is None
  assert starts.kept_plan_values(None, []) is None
  assert starts.parse('{"a": 1}\n\n{"b": 2}\n') == [{"a": 1}, {"b": 2}]
  with pytest.raises(ConfigError, match=r"^starts.jsonl line 3 is not a start's record \('\{\"c\": '\): torn or "
                                        r"edited; the resume compares"):
    starts.parse('{"a": 1}\n{"b": 2}\n{"c": ')  # a torn last line is never skipped


@pytest.mark.e2e
def test_a_torn_record_stops_the_resume_with_one_line_and_is_left_as_it_was(tmp_path):
  """As a user meets it: a run, its record's last line torn, a resume with a changed learning rate (real main.py)."""
  workdir = tmp_path / "run"
  first = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.train.steps=10",
                   "--config.summary.progress_bar=off", "--config.export=False")
  assert first.returncode == 0, first.stderr[-2000:]
  path = workdir / "starts.jsonl"
  torn = path.read_text()[:-25]
  path.write_text(torn)
  done = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.train.steps=20",
                  "--config.optimizer.learning_rate=0.5", "--config.summary.progress_bar=off")
  assert done.returncode == 1
  lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and lines[0].startswith(f"error: {path} line 1 is not a start's record ("), done.stderr
  assert "torn or edited; the resume compares its settings with the last start's, so repair or remove" in lines[0]
  assert path.read_text() == torn


def test_an_append_to_a_record_without_its_last_newline_starts_a_line_of_its_own(tmp_path):
  (tmp_path / "starts.jsonl").write_text('{"step": 0, "config": {}}')
  starts.append(str(tmp_path), {"step": 10, "config": {}})
  assert [s["step"] for s in starts.read(str(tmp_path))] == [0, 10]


def digits(steps, **overrides):
  return configured("digits_cnn", **{"train.steps": steps, "train.steps_per_loop": 5, "checkpoint.every_steps": 10,
                                     **overrides})


def record(workdir):
  return starts.read(str(workdir))


@pytest.mark.e2e
def test_a_changed_learning_rate_stops_the_resume_with_one_line_and_writes_nothing(tmp_path):
  run.train_and_evaluate(digits(10), str(tmp_path))
  config_json = (tmp_path / "config.json").read_text()
  with pytest.raises(ConfigError, match=r"^.* holds a run trained with other settings: optimizer.learning_rate: "
                                        r"0.05 -> 0.5, seed: 0 -> 3; to train on with the new values pass "
                                        r"--config.resume.accept_changes=True"):
    run.train_and_evaluate(digits(20, **{"optimizer.learning_rate": 0.5, "seed": 3}), str(tmp_path))
  assert len(record(tmp_path)) == 1 and (tmp_path / "config.json").read_text() == config_json
  with pytest.raises(ConfigError, match="optimizer.learning_rate: 0.05 -> 0.5"):  # --dry_run says the same
    run.train_and_evaluate(digits(20, **{"optimizer.learning_rate": 0.5}), str(tmp_path), dry_run=True)


@pytest.mark.e2e
def test_an_accepted_learning_rate_is_the_one_training_uses_and_every_record_shows(tmp_path):
  run.train_and_evaluate(digits(10), str(tmp_path))
  summary = run.train_and_evaluate(digits(20, **{"optimizer.learning_rate": 0.5, "resume.accept_changes": True}),
                                   str(tmp_path))
  rates = event_scalars(str(tmp_path), "train/learning_rate")
  assert rates[10] == pytest.approx(0.05) and rates[20] == pytest.approx(0.5)
  assert summary["learning_rate"] == 0.5 and json.loads((tmp_path / "plan.json").read_text())["learning_rate"] == 0.5
  first, second = record(tmp_path)
  assert (first["step"], second["step"]) == (0, 10)
  assert second["accepted_changes"] == [["optimizer.learning_rate", 0.05, 0.5], ["resume.accept_changes", False, True],
                                        ["train.steps", 10, 20]]
  assert first["config"]["optimizer"]["learning_rate"] == 0.05  # the first part's record is kept


@pytest.mark.e2e
def test_length_and_cadence_may_change_and_are_recorded(tmp_path, caplog):
  run.train_and_evaluate(digits(10), str(tmp_path))
  summary = run.train_and_evaluate(digits(20, **{"eval.every_steps": 5, "checkpoint.keep": 1}), str(tmp_path))
  assert summary["step"] == 20
  assert [s["accepted_changes"] for s in record(tmp_path)] == [
      [], [["checkpoint.keep", 3, 1], ["eval.every_steps", 0, 5], ["train.steps", 10, 20]]]


@pytest.mark.e2e
def test_another_replica_count_keeps_the_recorded_global_batch_and_learning_rate(tmp_path, caplog):
  per_replica = {"train.global_batch_size": None, "train.per_replica_batch_size": 16,
                 "optimizer.lr_scaling": "linear_replicas"}
  config = digits(10, **per_replica)
  run.train_and_evaluate(config, str(tmp_path))
  resumed = digits(20, **per_replica, strategy="mirrored", cpu_replicas=2)
  summary = run.train_and_evaluate(resumed, str(tmp_path))
  plan = json.loads((tmp_path / "plan.json").read_text())
  assert (plan["replicas"], plan["global_batch_size"], plan["per_replica_batch_size"]) == (2, 16, 8)
  assert plan["learning_rate"] == summary["learning_rate"] == pytest.approx(0.05)
  assert "resumed on 2 replica(s), recorded 1: global batch 16 and learning rate 0.05 kept" in caplog.text


@pytest.mark.e2e
def test_two_workers_resumed_as_two_mirrored_replicas_see_the_same_global_batches(tmp_path):
  mwms(tmp_path / "split", "configs/digits_cnn.py", {"train.steps": 3, "train.steps_per_loop": 3})
  split = trained(configured("digits_cnn"), "mirrored", tmp_path / "split")
  straight = trained(configured("digits_cnn"), "mirrored", tmp_path / "straight")
  assert_same(straight, split, "2 workers for 3 steps, then mirrored x2 for 3")
