"""What a researcher sees: a real TensorBoard server on a finished run, --dry_run, summary.json."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from loops import run
from tests.conftest import REPO, load_config, run_main
from tests.test_main import SHIPPED

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

TENSORBOARD = os.path.join(os.path.dirname(sys.executable), "tensorboard")


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def get(base, path, body=None):
  request = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=10) as response:
    raw = response.read()
  return raw if path.startswith("/data/plugin/images/individualImage") else json.loads(raw)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  c = load_config("digits_cnn")
  c.train.epochs, c.train.steps, c.train.steps_per_loop = None, 50, 10  # epoch 2 (steps 23..44) is timed
  c.eval.every_steps, c.summary.histogram_every_steps = 20, 20
  c.summary.profile_steps = (10, 20)
  workdir = tmp_path_factory.mktemp("tb")
  return workdir, run.train_and_evaluate(c, str(workdir))


@pytest.fixture(scope="module")
def tensorboard(finished_run):
  workdir, _ = finished_run
  port = free_port()
  server = subprocess.Popen([TENSORBOARD, f"--logdir={workdir}", "--host=127.0.0.1", f"--port={port}",
                             "--load_fast=false", "--reload_interval=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  base = f"http://127.0.0.1:{port}"
  try:
    deadline = time.monotonic() + 90
    while True:
      try:
        if get(base, "/data/plugin/scalars/tags").get(".", {}).get("eval/accuracy") is not None:
          break
      except OSError:
        pass
      assert server.poll() is None, server.stderr.read()[-2000:]
      assert time.monotonic() < deadline, "tensorboard did not serve the run within 90 s"
      time.sleep(1)
    yield base
  finally:
    server.terminate()
    server.wait(timeout=20)


def test_tensorboard_serves_the_scalars_the_run_logged(finished_run, tensorboard):
  _, summary = finished_run
  tags = get(tensorboard, "/data/plugin/scalars/tags")["."]
  for tag in ("train/loss", "train/accuracy", "train/learning_rate", "train/examples_per_sec",
              "train/step_time_sec", "train/epoch_time_sec", "eval/loss", "eval/accuracy", "eval/top5_accuracy"):
    assert tag in tags, tag

  def series(tag):
    return [(step, value) for _, step, value in
            get(tensorboard, f"/data/plugin/scalars/scalars?run=.&tag={urllib.parse.quote(tag)}")]

  assert [s for s, _ in series("train/loss")] == [10, 20, 30, 40, 50]
  assert series("train/loss")[-1][1] == pytest.approx(summary["train/loss"], rel=1e-6)
  assert [s for s, _ in series("eval/accuracy")] == [20, 40, 50]
  assert series("eval/accuracy")[-1][1] == pytest.approx(summary["eval/accuracy"], rel=1e-6)
  assert [s for s, _ in series("train/epoch_time_sec")] == [44]  # at the step that ended epoch 2 (inside a call)
  assert all(v == pytest.approx(0.05) for _, v in series("train/learning_rate"))


def test_tensorboard_hparams_tab_has_the_config_and_eval_metrics(finished_run, tensorboard):
  experiment = get(tensorboard, "/data/plugin/hparams/experiment", {"experimentName": ""})
  names = {h["name"] for h in experiment["hparamInfos"]}
  assert {"model.name", "optimizer.learning_rate", "train.global_batch_size", "strategy"} <= names
  metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
  assert {"eval/accuracy", "eval/loss"} <= metrics
  groups = get(tensorboard, "/data/plugin/hparams/session_groups",
               {"experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                                                          "STATUS_RUNNING"],
                "colParams": [], "startIndex": 0, "sliceSize": 10})
  hparams = groups["sessionGroups"][0]["hparams"]
  assert hparams["model.name"] == "digits_cnn" and hparams["optimizer.learning_rate"] == pytest.approx(0.05)
  _, summary = finished_run
  values = {m["name"]["tag"]: m["value"] for m in groups["sessionGroups"][0]["metricValues"]}
  assert values["eval/accuracy"] == pytest.approx(summary["eval/accuracy"], rel=1e-6)


def test_tensorboard_shows_input_image_grids_and_weight_histograms(tensorboard):
  images = get(tensorboard, "/data/plugin/images/tags")["."]
  assert {"train/input_images", "eval/input_images"} <= set(images)
  entries = get(tensorboard, "/data/plugin/images/images?run=.&tag=train/input_images")
  assert entries[0]["step"] == 0
  png = get(tensorboard, "/data/plugin/images/" + entries[0]["query"].join(["individualImage?", ""]))
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
  histograms = get(tensorboard, "/data/plugin/histograms/tags")["."]
  assert any(tag.startswith("weights/") and tag.endswith("kernel") for tag in histograms)
  assert "gradients/norm_per_variable" in histograms
  norms = get(tensorboard, "/data/plugin/scalars/scalars?run=.&tag=train/gradient_global_norm")
  assert [step for _, step, _ in norms] == [20, 40] and all(value > 0 for _, _, value in norms)


def test_an_input_grid_is_each_image_rescaled_on_one_canvas_the_figures_size():
  import numpy as np
  from loops.persist import writers
  digits = np.zeros((16, 8, 8, 1), np.float32)
  digits[:, 2:6, 3:5] = 7.0  # a bright bar on black: rescaled per image to 0 and 1
  grid = writers._grid_image(digits, np.arange(16) % 10)  # pylint: disable=protected-access
  assert grid.shape == (1, 488, 424, 3) and grid.dtype == np.uint8  # 4 x 4 cells: 96 pixels (8 x 12), label, gaps
  gray = grid[0].mean(axis=-1)
  black, white = np.mean(gray < 10), np.mean(gray > 245)
  assert 0.2 < black < 0.7 and white > 0.3, (black, white)  # the images' black, the canvas and the bars' white
  soft = np.full((3, 4), 0.25)
  assert writers._grid_image(np.random.rand(3, 16, 16, 3), soft).shape == (1, 248, 216, 3)  # 2 x 2 cells, one empty
  assert writers._grid_image(np.random.rand(1, 224, 224, 3), soft[:1]).shape == (1, 256, 240, 3)  # shown as it is


def test_profiler_trace_of_the_chosen_steps(finished_run):
  workdir, _ = finished_run
  traces = list((workdir / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 1000


def test_summary_json_has_the_documented_fields(finished_run):
  workdir, summary = finished_run
  on_disk = json.load(open(workdir / "summary.json"))
  for key in ("step", "train/loss", "train/accuracy", "eval/loss", "eval/accuracy", "best_metric", "best_value",
              "best_step", "wall_seconds", "train_seconds", "mean_epoch_seconds_excluding_first",
              "examples_per_sec", "replicas", "checkpoint", "export", "best_checkpoint"):
    assert key in on_disk, key
  assert on_disk["wall_seconds"] >= on_disk["train_seconds"] > 0
  assert os.path.exists(on_disk["export"]["keras"]) and os.path.exists(on_disk["checkpoint"] + ".index")
  assert os.path.exists(os.path.join(on_disk["export"]["saved_model"], "saved_model.pb"))


@pytest.mark.parametrize("name", SHIPPED)
def test_dry_run_reports_the_plan_of_every_shipped_config_and_writes_nothing(name, tmp_path, capsys):
  c = load_config(name, "synthetic")
  if c.strategy == "mirrored":
    c.cpu_replicas = 2
  report = run.train_and_evaluate(c, str(tmp_path / "w"), dry_run=True)
  printed = capsys.readouterr().out
  for key in ("strategy", "replicas", "global_batch_size", "per_replica_batch_size", "learning_rate",
              "train_examples", "eval_examples", "steps_per_epoch", "total_steps", "parameters", "workdir",
              "fused_batchnorm_layers"):
    assert f"  {key}: {report[key]}" in printed
  # ResNet-20: stem + 2 per block x 9 + 2 shortcuts; ResNet V2: 3 per block (16 or 50 blocks) + the final one
  assert report["fused_batchnorm_layers"] == {"cifar_resnet20": 21, "resnet50_mirrored": 49,
                                              "resnet152_mirrored": 151}.get(name, 0)
  assert report["global_batch_size"] == report["per_replica_batch_size"] * report["replicas"]
  assert not (tmp_path / "w").exists()


def test_dry_run_from_the_command_line_and_its_errors(tmp_path):
  ok = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'w'}", "--dry_run",
                "--config.train.global_batch_size=128")
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "  steps_per_epoch: 11" in ok.stdout and "  total_steps: 550" in ok.stdout
  assert not (tmp_path / "w").exists()
  bad = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'w'}", "--dry_run",
                 "--config.data.name=cifar_10")
  assert bad.returncode != 0
  assert bad.stderr.strip().splitlines()[-1].startswith("error: unknown dataset 'cifar_10' (did you mean 'cifar10'?)")
