"""The task contract (loops/task): every example task trains to the number its docstring states, 1 and 2 replicas
agree on it (the replica check), the classic cross-replica mistakes are caught, a task resumes bit-identically
after SIGTERM, trains under 2-worker MWMS like on one device and collects eval rows under parameter servers; the
sidecar evaluator, --dry_run and a sweep (with its HParams) work on tasks."""

import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from loops import replica_check
from loops import run
from tests.conftest import REPO, load_config, run_main, set_keys

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

PY = sys.executable
# example: (metric, "min"/"max", what its docstring promises at least)
STATED = {
    "regression": ("eval/mae", "min", 0.75),
    "sam": ("eval/accuracy", "max", 0.93),
    "gan": ("eval/mean_gap", "min", 0.12),
    "contrastive": ("eval/probe_accuracy", "max", 0.85),
    "segmentation": ("eval/mean_iou", "max", 0.9),
    "distillation": ("eval/accuracy", "max", 0.85),
}


@pytest.fixture(scope="module")
def teacher(quickstart_digits):
  """The digits quickstart's export (conftest's quickstart_digits): the distillation example's teacher."""
  workdir, summary = quickstart_digits
  assert summary["eval/accuracy"] > 0.95
  return os.path.join(workdir, "export", "model.keras")


def example_config(name, teacher_path=None):
  config = load_config("tasks", name)
  if name == "distillation":
    config.task.kwargs.teacher = teacher_path
  return config


@pytest.mark.parametrize("name", sorted(STATED))
def test_each_example_trains_to_its_stated_number(name, teacher, tmp_path):
  metric, mode, bound = STATED[name]
  summary = run.train_and_evaluate(example_config(name, teacher), str(tmp_path))
  value = summary[metric]
  assert (value <= bound) if mode == "min" else (value >= bound), (name, metric, value)
  assert summary["best_metric"] == metric and summary["best_value"] == pytest.approx(
      min(value, summary["best_value"]) if mode == "min" else max(value, summary["best_value"]))
  if name == "contrastive":  # reduce_eval over the whole eval set's embeddings
    assert summary["eval/knn_accuracy"] >= 0.85, summary
  exported = summary["export"]
  assert exported and os.path.isdir(exported["saved_model"]), exported  # every example's model serves
  loaded = tf.saved_model.load(exported["saved_model"])
  assert "serving_default" in loaded.signatures
  if name in ("contrastive", "regression"):  # a whole-set reduce_eval; a best checkpoint by a "min" metric
    assert_the_sidecar_evaluator_agrees(example_config(name, teacher), str(tmp_path), summary, metric)


def assert_the_sidecar_evaluator_agrees(config, workdir, trained, metric):
  """The sidecar evaluator (mode=evaluate) on a finished task run's asynchronously saved checkpoints: its final
  results are the trainer's final eval, its best checkpoint the best of what it evaluated."""
  config.mode = "evaluate"
  config.eval.sidecar_poll_seconds = 0.1
  evaluated = run.train_and_evaluate(config, workdir)
  assert evaluated["step"] == trained["step"]
  for key in [k for k in trained if k.startswith("eval/")]:
    assert evaluated[key] == pytest.approx(trained[key], rel=1e-5, abs=1e-6), key
  from tests.test_sidecar import event_scalars
  curve = event_scalars(os.path.join(workdir, "eval"), metric)  # every checkpoint the evaluator evaluated
  step, value = (min if config.checkpoint.best_mode == "min" else max)(curve.items(), key=lambda item: item[1])
  assert len(curve) >= 2 and curve[trained["step"]] == pytest.approx(trained[metric], rel=1e-5)
  best = json.load(open(os.path.join(workdir, "eval", "best", "best.json")))
  assert (best["metric"], best["step"]) == (metric, step) and best["value"] == pytest.approx(value), (best, curve)
  assert tf.train.latest_checkpoint(os.path.join(workdir, "eval", "best")).endswith(f"ckpt-{step}")


def test_the_gan_trains_under_float16_with_a_loss_scale_per_optimizer(tmp_path):
  """A step-level task scales each loss with its optimizer (scale_loss): two dynamic loss scales, checkpointed."""
  config = example_config("gan")
  config.mixed_precision, config.export = "float16", False
  summary = run.train_and_evaluate(config, str(tmp_path))
  metric, _, bound = STATED["gan"]
  assert summary[metric] <= bound, summary
  reader = tf.compat.v1.train.NewCheckpointReader(summary["checkpoint"])
  scales = {name: reader.get_tensor(f"{name}/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE")
            for name in ("optimizer", "optimizer_discriminator")}
  assert all(1.0 <= value <= 2.0 ** 15 for value in scales.values()), scales


def test_the_replica_check_passes_the_distillation_example(teacher):
  """The other examples and the built-in are rows of tests/test_replica_matrix.py (this one needs the teacher)."""
  config = example_config("distillation", teacher)
  from loops import private_apis
  lines, determinism = [], private_apis.op_determinism_enabled()
  assert replica_check.run(config, out=lines.append), "\n".join(lines)
  assert lines[-1].startswith("replicas: PASS: 1 and 2 replicas agree on all ")
  assert private_apis.op_determinism_enabled() == determinism  # left as it was (XLA's MaxPool gradient refuses it)


@pytest.mark.parametrize("wrong, overrides, located", [
    ("LocallyCentred", {},  # a batch statistic of the replica's rows
     "every layer's output agrees at step 1; the per-example loss differs: LocallyCentred.per_example_loss "
     "(tests/fixtures/wrong_tasks.py:{line}) reduces over the replica's own rows"),
    ("LocalNegatives", {},  # contrastive negatives from the replica only
     "every layer's output agrees at step 1; the per-example loss differs: LocalNegatives.per_example_loss "
     "(tests/fixtures/wrong_tasks.py:{line}) reduces over the replica's own rows"),
    ("PartlyCentred", {"check.steps": 1},  # a tenth of LocallyCentred, through the regression model's max pool
     "every layer's output agrees at step 1; the per-example loss differs: PartlyCentred.per_example_loss "
     "(tests/fixtures/wrong_tasks.py:{line}) reduces over the replica's own rows"),
    ("MeanOverLocalBatch", {"optimizer.name": "sgd", "optimizer.learning_rate": 0.01},  # tf.reduce_mean
     "every layer's output agrees at step 1; the loss the step returns differs: MeanOverLocalBatch.train_step "
     "(tests/fixtures/wrong_tasks.py:{line}) reduces over the replica's own rows"),
])
def test_the_replica_check_fails_a_step_that_reduces_over_the_replica_batch_and_names_its_loss(wrong, overrides,
                                                                                                 located):
  base = "contrastive" if wrong == "LocalNegatives" else "regression"
  if wrong in COMMAND_LINE:  # `main.py --check=replicas` from the command line: exits 1 with the verdict last
    result = run_main(f"--config=configs/tasks.py:{base}", "--check=replicas",
                      f"--config.task.name=tests.fixtures.wrong_tasks:{wrong}")
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("replicas: FAIL: "), result.stdout[-2000:]
    # the config in the log once, not once per side built (7 rebuilds: ~1 200 lines around the verdict)
    assert len(re.findall(r"\] config:$", result.stderr, re.M)) == 1, result.stderr[-3000:]
  else:
    config = example_config(base)
    config.task.name = f"tests.fixtures.wrong_tasks:{wrong}"
    for key, value in overrides.items():
      group, field = key.split(".")
      config[group][field] = value
    lines = []
    assert not replica_check.run(config, out=lines.append), "\n".join(lines)
  located = located.format(line=defined_at(*re.search(r"(\w+)\.(\w+) \(tests/", located).groups()))
  assert lines[-1].startswith("replicas: FAIL: ") and ": cause: " + located in lines[-1], lines[-1]


def defined_at(class_name, method):
  """The line where tests/fixtures/wrong_tasks.py defines `class_name.method` (the line the check's cause names)."""
  from tests.fixtures import wrong_tasks
  return inspect.getsourcelines(getattr(getattr(wrong_tasks, class_name), method))[1]


# the row checked as a user runs it, `main.py --check=replicas` (what
# test_check_replicas_from_the_command_line_exits_1_with_the_verdict_last asserted of the same config, run once)
COMMAND_LINE = ("LocallyCentred",)


def test_a_task_run_split_by_sigterm_ends_bit_identical_to_a_straight_one(tmp_path):
  from tests.test_reliability import split_by_sigterm_matches_straight
  args = [PY, "main.py", "--config=configs/tasks.py:gan", "--config.deterministic=True",
          "--config.train.steps=300", "--config.train.steps_per_loop=5", "--config.eval.every_steps=0",
          "--config.checkpoint.every_steps=100", "--config.checkpoint.best_metric=", "--config.export=False",
          "--config.summary.progress_bar=off"]
  # mid-interval (checkpoints every 100) and mid-epoch (22 steps): the preemption save is one save more
  _, resumed = split_by_sigterm_matches_straight(args, tmp_path, wait_for=r"step 1[1-7]\d/300")
  assert re.search(r"restored .*ckpt-1[1-9]\d", resumed)


@pytest.mark.parametrize("config, keys", [
    ("segmentation", ("train/loss", "eval/loss", "eval/pixel_accuracy", "eval/mean_iou")),  # MeanIoU over workers
    # reduce_eval over all workers' rows; ctx.normal pairs each example with its one-device draw
    ("regression", ("train/loss", "train/noise_pairing", "eval/mae", "eval/count", "eval/value_sum")),
])
def test_a_task_under_two_worker_mwms_matches_one_device(config, keys, tmp_path):
  from tests.test_reliability import env
  settings = {"deterministic": True, "train.steps": 40, "train.steps_per_loop": 20, "eval.every_steps": 40,
              "export": False, "summary.progress_bar": "off", "checkpoint.best_metric": ""}
  if config == "regression":
    settings["task.name"] = "tests.fixtures.contract_tasks:CollectsValues"
  # one device in this process (what is asserted of it is its summary.json), the 2 workers as a user starts them
  run.train_and_evaluate(set_keys(load_config("tasks", config), settings), str(tmp_path / "one"))
  args = [f"--config=configs/tasks.py:{config}", *(f"--config.{key}={value}" for key, value in settings.items())]
  two = subprocess.run([PY, "-m", "launch.local", "--workers=2", "--", PY, "main.py", *args,
                        "--config.strategy=multi_worker_mirrored", f"--workdir={tmp_path / 'two'}"], cwd=REPO,
                       env=env(), capture_output=True, text=True, timeout=400)
  assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
  one_summary, two_summary = (json.load(open(tmp_path / d / "summary.json")) for d in ("one", "two"))
  assert two_summary["replicas"] == 2
  for key in keys:
    assert two_summary[key] == pytest.approx(one_summary[key], rel=1e-3), key
  if config == "regression":
    assert two_summary["eval/count"] == 360  # every eval example once, none of the padding


def subclassed(model_name, strategy="one_device", steps=60):
  config = load_config("digits_cnn")
  config.model.name = f"tests.fixtures.subclassed_models:{model_name}"
  config.train.epochs, config.train.steps, config.train.steps_per_loop = None, steps, 20
  config.eval.every_steps = config.checkpoint.every_steps = steps
  config.strategy, config.cpu_replicas, config.deterministic = strategy, 2 if strategy == "mirrored" else 0, True
  return config


def test_a_subclassed_keras_model_trains_resumes_exports_and_two_replicas_match_one(tmp_path):
  one = run.train_and_evaluate(subclassed("net"), str(tmp_path / "one"))
  two = run.train_and_evaluate(subclassed("net", "mirrored"), str(tmp_path / "two"))
  assert one["eval/accuracy"] > 0.8, one
  for key in ("train/loss", "eval/loss", "eval/accuracy"):
    assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
  assert set(one["export"]) == {"keras", "saved_model"}
  resumed = run.train_and_evaluate(subclassed("net", steps=80), str(tmp_path / "one"))
  assert resumed["step"] == 80 and resumed["eval/loss"] < one["eval/loss"] * 1.5


def test_a_model_that_cannot_take_the_features_is_said_before_training_and_the_rest_is_exported(tmp_path, caplog):
  config = example_config("gan")
  config.task.name = "tests.fixtures.contract_tasks:GanWithoutServingSpec"
  config.train.steps, config.eval.every_steps = 20, 20
  summary = run.train_and_evaluate(config, str(tmp_path))
  messages = [r.getMessage() for r in caplog.records]
  said = next(i for i, m in enumerate(messages) if "the task's predict_step cannot serve its features" in m)
  assert said < next(i for i, m in enumerate(messages) if m.startswith("step ")), messages[said]
  assert "(ValueError: Invalid input shape for input Tensor(" in messages[said], messages[said]  # Keras' words
  assert "Task.serving_spec names what it takes; export=False turns the export off" in messages[said]
  assert set(summary["export"]) == {"keras", "saved_model"} and summary["export"]["saved_model"] is None
  assert os.path.isfile(summary["export"]["keras"])


def test_a_model_keras_cannot_serialise_exports_its_weights_said_before_training(tmp_path, caplog):
  summary = run.train_and_evaluate(subclassed("wrapped"), str(tmp_path))
  said = [r.getMessage() for r in caplog.records if "cannot be saved as a .keras file" in r.getMessage()]
  assert said and "export=False turns the export off" in said[0], said
  assert re.search(r"\((NotImplementedError|TypeError): \w.{20,}\); exporting its weights", said[0]), said[0]
  train_lines = [i for i, r in enumerate(caplog.records) if r.getMessage().startswith("step ")]
  assert caplog.records.index(next(r for r in caplog.records if r.getMessage() == said[0])) < train_lines[0]
  assert set(summary["export"]) == {"weights", "saved_model"}, summary["export"]
  assert os.path.isfile(summary["export"]["weights"])
  served = tf.saved_model.load(summary["export"]["saved_model"]).signatures["serving_default"]
  assert served(images=tf.zeros([2, 8, 8, 1], tf.float32))["probabilities"].shape == (2, 10)
  with open(tmp_path / "summary.json") as f:
    assert json.load(f)["eval/accuracy"] == summary["eval/accuracy"]
  again = run.train_and_evaluate(subclassed("wrapped"), str(tmp_path))  # a rerun of the finished run
  assert again["step"] == 60 and set(again["export"]) == {"weights", "saved_model"}


def test_a_task_collecting_eval_rows_under_parameter_servers_reduces_the_whole_eval_set(tmp_path):
  from examples.tasks.regression import digit_values
  from tests.test_reliability import env
  result = subprocess.run(
      [PY, "-m", "launch.local", "--workers=2", "--ps=1", "--", PY, "main.py", "--config=configs/tasks.py:regression",
       "--config.task.name=tests.fixtures.contract_tasks:CollectsValues", "--config.strategy=parameter_server",
       "--config.train.steps=20", "--config.train.steps_per_loop=10", "--config.eval.every_steps=20",
       "--config.export=False", "--config.summary.progress_bar=off", "--config.checkpoint.best_metric=eval/value_sum",
       f"--workdir={tmp_path}"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=400)
  assert result.returncode == 0, result.stdout[-3000:]
  summary = json.load(open(tmp_path / "summary.json"))
  values = digit_values("eval")[1]
  assert summary["step"] == 20 and summary["eval/count"] == len(values) == 360  # on the coordinator, no padding
  assert summary["eval/value_sum"] == pytest.approx(float(values.sum()), rel=1e-6)
  assert summary["best_metric"] == "eval/value_sum" and "train/noise_pairing" in summary


@pytest.mark.parametrize("name, frozen", [("distillation", "teacher"), ("gan", None)])
def test_dry_run_names_the_task_its_models_optimizers_and_trained_parameters(name, frozen, teacher, tmp_path):
  config = example_config(name, teacher)
  report = run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)
  assert not (tmp_path / "w").exists()
  assert report["task"].startswith(config.task.name) and "level" in report["task"]
  parts_by_name = {n: int(re.search(r"(\d+) parameters", line).group(1)) for n, line in report["models"].items()}
  trained = [n for n in parts_by_name if n != frozen]
  assert sorted(report["optimizers"]) == sorted(trained)  # one optimizer per trained model
  assert report["trained_parameters"] == sum(parts_by_name[n] for n in trained)
  if frozen:
    assert report["models"][frozen].endswith(", frozen") and parts_by_name[frozen] > 0
    return
  config.train.freeze = ("^discriminator/features",)  # train.freeze reaches every model of a task by its name
  frozen_layer = run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)
  assert frozen_layer["trained_parameters"] == report["trained_parameters"] - (64 * 64 + 64)


def test_a_sweep_over_a_tasks_settings_runs_each_trial_and_tables_its_best_metric(tmp_path):
  import csv
  sweep_dir = tmp_path / "sweep"
  result = subprocess.run(
      [PY, "-m", "launch.sweep", "--config=configs/tasks.py:regression", f"--sweep_dir={sweep_dir}",
       "--grid", "optimizer.learning_rate=0.001,0.002", "--", "--config.train.steps=20",
       "--config.train.steps_per_loop=10", "--config.eval.every_steps=10", "--config.export=False"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  with open(sweep_dir / "report.csv") as f:
    rows = list(csv.DictReader(f))
  assert sorted(row["optimizer.learning_rate"] for row in rows) == ["0.001", "0.002"]
  for row in rows:
    summary = json.load(open(sweep_dir / row["trial"] / "summary.json"))
    assert row["status"] == "complete" and summary["best_metric"] == "eval/mae"
    assert float(row["best eval/mae"]) == pytest.approx(summary["best_value"])  # the min over its two evals
    trained_with = json.load(open(sweep_dir / row["trial"] / "config.json"))
    assert trained_with["optimizer"]["learning_rate"] == float(row["optimizer.learning_rate"])
    assert trained_with["task"]["name"] == "examples.tasks.regression:DigitValue"
  from tensorboard.backend.event_processing import plugin_event_multiplexer
  from tensorboard.plugins.hparams import metadata
  multiplexer = plugin_event_multiplexer.EventMultiplexer()
  multiplexer.AddRunsFromDirectory(str(sweep_dir))
  multiplexer.Reload()
  content = multiplexer.PluginRunToTagToContent(metadata.PLUGIN_NAME)
  assert {run for run, tags in content.items() if metadata.SESSION_START_INFO_TAG in tags} == {
      row["trial"] for row in rows}  # HParams: a session per trial, the task's eval values as its metrics
  experiment = metadata.parse_experiment_plugin_data(content["."][metadata.EXPERIMENT_TAG])
  assert "eval/mae" in [m.name.tag for m in experiment.metric_infos]
