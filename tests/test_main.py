"""main.py as a user runs it: a fresh process, exit codes and one-line errors."""

import json
import os

import pytest

from loops import run
from tests.conftest import load_config, run_main

SHIPPED = ["digits_cnn", "mnist_cnn", "cifar_resnet20", "quickdraw_cnn", "resnet50_mirrored", "resnet152_mirrored"]


@pytest.mark.e2e
def test_main_trains_and_writes_its_outputs_without_tensorflows_chatter(tmp_path):
  workdir = tmp_path / "run"
  result = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.train.steps=40",
                    "--config.eval.every_steps=0", "--config.checkpoint.every_steps=20",
                    unset=["TF_CPP_MIN_LOG_LEVEL"])  # as from a user's shell
  assert result.returncode == 0, result.stderr[-2000:]
  assert "step 40/40" in result.stderr and "eval at step 40" in result.stderr
  assert "saved checkpoint" in result.stderr
  for chatter in ("cuInit", "Sharding callback duration", "I0000 ", "oneDNN custom operations",
                  "PreemptionCheckpointHandler"):
    assert chatter not in result.stderr, chatter
  assert json.load(open(workdir / "summary.json"))["step"] == 40
  assert json.load(open(workdir / "config.json"))["train"]["steps"] == 40


@pytest.mark.e2e
@pytest.mark.parametrize("args, message", [
    (["--config=configs/digits_cnn.py", "--config.model.name=resnet5Ov2"],
     "error: unknown model 'resnet5Ov2' (did you mean 'resnet50v2'?); valid: mnist_cnn, digits_cnn"),
    (["--config=configs/digits_cnn.py", "--config.optimizer.nmae=adam"],
     "error: unknown config key 'optimizer.nmae' in --config.optimizer.nmae=adam (did you mean 'optimizer.name'?)"),
    (["--config=configs/digits_cnn.py", "--config.train.steps=ten"],
     "error: flag --config.train.steps=ten: invalid literal for int()"),
    (["--config=configs/digits_cnn.py:synthtic"],
     "error: unknown config argument 'synthtic'; valid arguments: synthetic"),
    (["--config=configs/no_such.py"], "error: [Errno 2] No such file or directory: 'configs/no_such.py'"),
    (["--config=configs/digits_cnn.py", "--config.strategy=mirrored", "--config.cpu_replicas=3"],
     "error: global batch size 64 is not divisible by the 3 replicas; use a multiple of 3"),
    (["--config=configs/digits_cnn.py", "--config.strategy=mirorred"],
     "error: unknown strategy 'mirorred' (did you mean 'mirrored'?)"),
    (["--config=configs/digits_cnn.py", "--config.strategy=multi_worker_mirrored"],
     "error: strategy 'multi_worker_mirrored' needs a cluster: set TF_CONFIG, run under srun, or start it with"),
    (["--config=configs/digits_cnn.py", "--config.strategy=parameter_server"],
     "error: strategy 'parameter_server' needs a cluster with one chief, workers and ps; TF_CONFIG"),
    (["--config=configs/digits_cnn.py", "--config.model.name=examples.models:cnn_with_embedding",
      "--config.model.kwargs.embeding_dim=16"],
     "error: model.kwargs {'embeding_dim': 16} do not fit examples.models:cnn_with_embedding: got an unexpected"),
    (["--config=configs/digits_cnn.py", "--config.data.mixup_alpha=-1"], "error: data.mixup_alpha must be >= 0"),
    (["--config=configs/digits_cnn.py", "--config.strategy=tpu"],
     "error: strategy 'tpu' found no TPU (cluster.tpu=''): "),
])
def test_bad_input_is_one_line_with_nonzero_exit_and_the_workdir_untouched(args, message, tmp_path):
  workdir = tmp_path / "existing"
  workdir.mkdir()
  (workdir / "config.json").write_text("{\"keep\": \"me\"}")
  result = run_main(*args, f"--workdir={workdir}")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(message), last
  assert "Traceback" not in result.stderr
  assert sorted(os.listdir(workdir)) == ["config.json"]
  assert (workdir / "config.json").read_text() == "{\"keep\": \"me\"}"


@pytest.mark.e2e
@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_runs_a_few_steps_on_synthetic_data(name, tmp_path):
  c = load_config(name, "synthetic")
  c.train.epochs, c.train.steps, c.train.steps_per_loop = None, 2, 1
  c.eval.every_steps, c.checkpoint.every_steps = 0, 0
  if c.strategy == "mirrored":
    c.cpu_replicas = 2
  c.train.global_batch_size = 2 if "resnet" in name and "mirrored" in name else 8
  if "resnet" in name and "mirrored" in name:
    c.data.synthetic.eval_examples = 4
  if name == "resnet152_mirrored":  # tracing its 2-replica graph takes minutes; resnet50_mirrored trains the same
    report = run.train_and_evaluate(c, str(tmp_path), dry_run=True)  # code: this one is built and checked only
    assert report["model"] == "resnet152v2" and report["parameters"] > 50_000_000 and not os.listdir(tmp_path)
    return
  summary = run.train_and_evaluate(c, str(tmp_path))
  assert summary["step"] == 2 and 0.0 <= summary["eval/accuracy"] <= 1.0


@pytest.mark.e2e
def test_malformed_tf_config_is_one_line(tmp_path):
  result = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path}",
                    env={"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 2}}'})
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      "error: TF_CONFIG task.index 2 is out of range: job 'worker' has 1 address(es)")
  assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_a_checkpoint_of_another_model_is_refused_and_nothing_is_overwritten(tmp_path):
  workdir = tmp_path / "w"
  first = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.train.steps=10",
                   "--config.train.steps_per_loop=10", "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0")
  assert first.returncode == 0, first.stderr[-2000:]
  before = {p.name: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  other = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.model.name=mnist_cnn")
  assert other.returncode == 1
  assert other.stderr.strip().splitlines()[-1].startswith(
      f'error: {workdir} holds a run trained with other settings: model.name: "digits_cnn" -> "mnist_cnn"')
  accepted = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.model.name=mnist_cnn",
                      "--config.resume.accept_changes=True")  # accepted, the checkpoint still cannot be restored
  assert accepted.returncode == 1
  assert accepted.stderr.strip().splitlines()[-1].startswith(
      f"error: checkpoint {workdir}/checkpoints/ckpt-10 does not match this model/optimizer")
  assert {p.name: p.read_bytes() for p in workdir.rglob("*") if p.is_file()} == before


@pytest.mark.e2e
@pytest.mark.parametrize("args, message", [
    (["--config.data.name=digit"], "error: unknown dataset 'digit' (did you mean 'digits'?); valid: digits, "),
    (["--config.optimizer.name=adamm"], "error: unknown optimizer 'adamm' (did you mean 'adam'?); valid: sgd, adam, adamw"),
    (["--config.data.name=mnist", "--config.data.download=False"],
     "error: tfds dataset 'mnist' is not in EMPTY and data.download is False; provide it with `tfds build mnist"),
    (["--config.train.steps=0"], "error: train.steps must be >= 1"),
    (["--config.eval.every_steps=-30"], "error: eval.every_steps must be 0 (only at the end / off) or a number of "
                                        "steps: >= 0, got -30"),
    (["--config.checkpoint.best_metric=eval/acuracy"], "error: checkpoint.best_metric 'eval/acuracy' is not an eval "
                                                       "metric of this run; valid: eval/loss, eval/accuracy"),
    (["--config.loss.name=nowhere.losses:focal"], "error: cannot import module 'nowhere.losses' for "
                                                  "loss.name='nowhere.losses:focal'"),
    (["--config.callbacks=nowhere.hooks:make"], "error: cannot import module 'nowhere.hooks' for "
                                                "callbacks='nowhere.hooks:make'"),
    (["--config.eval.metrics=('accuracy', 'tests.fixtures.plugins.my_callbacks:recorder')"],
     "error: eval.metrics='tests.fixtures.plugins.my_callbacks:recorder' must be a function taking 0 positional"),
])
def test_more_bad_input_is_one_line(args, message, tmp_path):
  empty = tmp_path / "no_data"
  empty.mkdir()
  result = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'w'}",
                    f"--config.data.data_dir={empty}", *args)
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(message.replace("EMPTY", str(empty))), last
  assert not (tmp_path / "w").exists()


@pytest.mark.e2e
def test_an_unwritable_workdir_is_one_line(tmp_path):
  """A workdir under a regular file cannot be created, even by root (a read-only directory would not stop root)."""
  blocker = tmp_path / "a_file"
  blocker.write_text("keep")
  result = run_main("--config=configs/digits_cnn.py", f"--workdir={blocker / 'w'}")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last == f"error: workdir '{blocker / 'w'}' is not writable: {blocker} is not a directory", last
  assert blocker.read_text() == "keep"


@pytest.mark.e2e
def test_a_corrupt_image_in_an_image_folder_is_one_line_naming_the_file(tmp_path):
  from tests.test_data import make_image_folder, truncated_png
  root = make_image_folder(tmp_path / "images", corrupt=[("test", "cat", "bad.png", truncated_png())])
  result = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'w'}", "--config.data.name=image_folder",
                    f"--config.data.data_dir={root}", "--config.data.image_size=8")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: image {root}/test/cat/bad.png is unreadable or corrupt (Invalid PNG. Failed to "
                         "initialize decoder.); set data.corrupt_images=skip to leave such files out (valid: fail, "
                         "skip)"), last
  assert "Traceback" not in result.stderr and not (tmp_path / "w").exists()
