"""mode=predict (loops/predict.py, loops/persist/predictions.py): every example's outputs once, in input order, the
same files on one device, 2 mirrored replicas and 2 workers; a kill resumes to the same files; a folder of images;
a task's predict_step; bad input is one line before anything is written."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import run
from loops.task import Task
from tests.conftest import REPO, load_config

PY = sys.executable


@pytest.fixture(scope="module")
def trained(trained_digits):
  return trained_digits


def predicting(trained, tmp_path, **settings):
  """(config in mode=predict with predict.<key>=value, a copy of the trained workdir)."""
  config, workdir, _ = trained
  config = config.copy_and_resolve_references()
  config.mode = "predict"
  for key, value in settings.items():
    config.predict[key] = value
  copy = str(tmp_path / "w")
  shutil.copytree(workdir, copy)
  return config, copy


def rows(directory):
  """{column: numpy} of every part in order, and the manifest."""
  parts = sorted(glob.glob(f"{directory}/part-*.npz"))
  loaded = [dict(np.load(part)) for part in parts]
  return {name: np.concatenate([part[name] for part in loaded]) for name in loaded[0]}, \
      json.load(open(f"{directory}/manifest.json"))


@pytest.mark.e2e
def test_predictions_hold_each_example_once_in_order_and_score_the_eval_accuracy(trained, tmp_path):
  from data import sources
  config, workdir = predicting(trained, tmp_path, rows_per_file=100)
  manifest = run.train_and_evaluate(config, workdir)
  columns, written = rows(f"{workdir}/predictions/digits_test-20")
  assert written == manifest and manifest["examples"] == 360 and manifest["step"] == 20
  assert [(f["file"], f["rows"], f["first"]) for f in manifest["files"]] == [
      ("part-00000.npz", 100, 0), ("part-00001.npz", 100, 100), ("part-00002.npz", 100, 200),
      ("part-00003.npz", 60, 300)]
  assert np.array_equal(columns["index"], np.arange(360))
  labels = np.concatenate([y for _, y in sources.digits(config.data).eval.batch(1000).as_numpy_iterator()])
  assert np.array_equal(columns["label"], labels)
  accuracy = float(np.mean(columns["class"] == columns["label"]))
  assert accuracy == pytest.approx(trained[2][20], abs=1e-6)
  assert np.allclose(columns["probabilities"].sum(axis=1), 1.0, atol=1e-5)
  assert np.array_equal(columns["class"], columns["probabilities"].argmax(axis=1))
  assert manifest["columns"]["probabilities"] == {"dtype": "float32", "shape": [10]}
  before = {p: os.path.getmtime(p) for p in glob.glob(f"{workdir}/predictions/digits_test-20/*")}
  assert run.train_and_evaluate(config, workdir)["files"] == manifest["files"]  # a rerun: complete, untouched
  assert {p: os.path.getmtime(p) for p in glob.glob(f"{workdir}/predictions/digits_test-20/*")} == before


@pytest.mark.e2e
def test_two_mirrored_replicas_write_the_same_files_and_a_removed_tail_is_predicted_again(trained, tmp_path):
  config, workdir = predicting(trained, tmp_path, rows_per_file=100, checkpoint="10")
  run.train_and_evaluate(config, workdir)
  one, _ = rows(f"{workdir}/predictions/digits_test-10")
  for name in ("part-00002.npz", "part-00003.npz", "manifest.json"):  # as a kill after two parts leaves it
    os.remove(f"{workdir}/predictions/digits_test-10/{name}")
  config.strategy, config.cpu_replicas = "mirrored", 2
  manifest = run.train_and_evaluate(config, workdir)
  resumed, _ = rows(f"{workdir}/predictions/digits_test-10")
  assert manifest["replicas"] == 2 and [f["rows"] for f in manifest["files"]] == [100, 100, 100, 60]
  for name in one:
    assert np.array_equal(resumed[name], one[name]), name
  shutil.rmtree(f"{workdir}/predictions")
  run.train_and_evaluate(config, workdir)
  mirrored, _ = rows(f"{workdir}/predictions/digits_test-10")
  for name in one:
    assert np.array_equal(mirrored[name], one[name]), name


def main_command(workdir, *overrides):
  return [PY, "main.py", "--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.mode=predict",
          *overrides]


@pytest.mark.e2e
@pytest.mark.parametrize("strategy, launched, predicting_workers", [
    ("multi_worker_mirrored", ["--workers=2"], 2),
    ("parameter_server", ["--workers=2", "--ps=1"], 1),  # the coordinator predicts alone
])
def test_two_workers_write_the_files_of_one_device(trained, tmp_path, strategy, launched, predicting_workers):
  config, workdir = predicting(trained, tmp_path, rows_per_file=100)
  run.train_and_evaluate(config, workdir)
  one, _ = rows(f"{workdir}/predictions/digits_test-20")
  shutil.rmtree(f"{workdir}/predictions")
  result = subprocess.run(
      [PY, "-m", "launch.local", *launched, "--", *main_command(
          workdir, f"--config.strategy={strategy}", "--config.predict.rows_per_file=100")],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  workers, manifest = rows(f"{workdir}/predictions/digits_test-20")
  assert manifest["workers"] == predicting_workers
  for name in one:
    assert np.array_equal(workers[name], one[name]), name
  assert result.stdout.count("predicted 360 examples (360 this run)") == predicting_workers  # each took part


@pytest.mark.e2e
def test_a_prediction_killed_by_sigterm_resumes_to_the_same_files(trained, tmp_path):
  """Batches of 1 over the 1 437 train examples, parts of 50: SIGTERM once 5 parts are written, then a rerun."""
  config, workdir = predicting(trained, tmp_path)
  command = main_command(workdir, "--config.data.eval_split=train", "--config.train.global_batch_size=1",
                         "--config.predict.rows_per_file=50")
  directory = f"{workdir}/predictions/digits_train-20"
  process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while not os.path.exists(f"{directory}/part-00004.npz") and time.time() < deadline and process.poll() is None:
    time.sleep(0.01)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=60) == -signal.SIGTERM
  assert not os.path.exists(f"{directory}/manifest.json")
  written = len(glob.glob(f"{directory}/part-*.npz"))
  assert 5 <= written < 29
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"predicted 1437 examples ({1437 - 50 * written} this run)" in result.stderr
  resumed, manifest = rows(directory)
  shutil.rmtree(directory)
  config.data.eval_split, config.train.global_batch_size, config.predict.rows_per_file = "train", 1, 50
  run.train_and_evaluate(config, workdir)
  whole, _ = rows(directory)
  assert len(manifest["files"]) == 29 and manifest["timed_examples"] == 1437 - 50 * written
  for name in whole:
    assert np.array_equal(resumed[name], whole[name]), name


@pytest.mark.e2e
def test_a_folder_of_images_is_predicted_in_path_order_as_the_split_is(trained, tmp_path):
  from PIL import Image
  from data import sources
  config, workdir = predicting(trained, tmp_path)
  run.train_and_evaluate(config, workdir)
  split, _ = rows(f"{workdir}/predictions/digits_test-20")
  images = np.concatenate([x for x, _ in sources.digits(config.data).eval.batch(1000).as_numpy_iterator()])
  folder = tmp_path / "new images"
  for i in range(12):  # nested folders, read in sorted path order; 8-bit files: digits' 0..16 spread over 0..255
    path = folder / f"batch{i // 5}" / f"{i:03d}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.round(images[i][..., 0] * (255 / 16)).astype(np.uint8)).save(path)
  (folder / "notes.txt").write_text("not an image")
  config.predict.input = str(folder)
  manifest = run.train_and_evaluate(config, workdir)
  columns, _ = rows(f"{workdir}/predictions/new_images-20")
  assert manifest["examples"] == 12 and "label" not in columns
  assert [os.path.relpath(p, folder) for p in columns["path"]] == [
      f"batch{i // 5}/{i:03d}.png" for i in range(12)]
  assert np.array_equal(columns["class"], split["class"][:12])
  assert np.allclose(columns["probabilities"], split["probabilities"][:12], atol=1e-6)
  config.predict.input = str(folder / "batch1" / "*.png")  # a glob: the folder it is in names the directory
  assert run.train_and_evaluate(config, workdir)["examples"] == 5
  columns, _ = rows(f"{workdir}/predictions/batch1-20")
  assert np.array_equal(columns["class"], split["class"][5:10])


@pytest.mark.e2e
def test_a_task_predicts_through_its_predict_step(tmp_path):
  config = load_config("tasks", "regression")
  config.train.steps, config.export = 20, False
  workdir = str(tmp_path / "w")
  summary = run.train_and_evaluate(config, workdir)
  config.mode = "predict"
  run.train_and_evaluate(config, workdir)
  columns, manifest = rows(f"{workdir}/predictions/digit_values_test-20")
  from examples.tasks.regression import digit_values
  values = digit_values("test")[1]
  assert set(columns) == {"index", "value"} and manifest["columns"]["value"] == {"dtype": "float32", "shape": []}
  assert float(np.mean(np.abs(columns["value"] - values))) == pytest.approx(summary["eval/mae"],
                                                                            rel=1e-5)


@pytest.mark.e2e
def test_other_data_is_predicted_into_its_own_directory(tmp_path):
  """A run trained on an .npz, then data.* pointed at another .npz of 30 new examples (fewer than a global batch):
  predictions/<file>_<split>-<step>, beside the split's, the same rows for the same images."""
  from data import sources
  config = load_config("digits_cnn")
  digits = sources.digits(config.data)
  (x_train, y_train), (x_test, y_test) = (
      next(split.batch(2000).as_numpy_iterator()) for split in (digits.train, digits.eval))
  np.savez(tmp_path / "digits.npz", x_train=x_train * 15, y_train=y_train, x_test=x_test * 15, y_test=y_test)
  np.savez(tmp_path / "new.npz", x_train=x_test[:30] * 15, y_train=y_test[:30], x_test=x_test[:30] * 15,
           y_test=y_test[:30])
  config.data.name, config.data.data_dir = "npz", str(tmp_path / "digits.npz")
  config.train.epochs, config.train.steps, config.train.steps_per_loop, config.export = None, 10, 5, False
  workdir = str(tmp_path / "w")
  run.train_and_evaluate(config, workdir)
  config.mode = "predict"
  run.train_and_evaluate(config, workdir)
  split, _ = rows(f"{workdir}/predictions/digits_test-10")
  config.data.data_dir = str(tmp_path / "new.npz")
  manifest = run.train_and_evaluate(config, workdir)
  columns, _ = rows(f"{workdir}/predictions/new_test-10")
  assert manifest["examples"] == 30 and manifest["input"] == f"npz:test in {tmp_path}/new.npz"
  assert np.array_equal(columns["class"], split["class"][:30]) and np.array_equal(columns["label"], y_test[:30])
  # another new.npz (other images, as many) would go to the same directory: refused, not served its predictions
  os.mkdir(tmp_path / "b")
  np.savez(tmp_path / "b" / "new.npz", x_train=x_test[30:60] * 15, y_train=y_test[30:60],
           x_test=x_test[30:60] * 15, y_test=y_test[30:60])
  config.data.data_dir = str(tmp_path / "b" / "new.npz")
  before = {p: os.path.getmtime(p) for p in glob.glob(f"{workdir}/predictions/new_test-10/*")}
  with pytest.raises(ConfigError, match=rf"^{workdir}/predictions/new_test-10 holds other predictions \(input "
                                        rf"'npz:test in {tmp_path}/new.npz' there, 'npz:test in {tmp_path}/b/new.npz' "
                                        r"now\); remove it to predict again$"):
    run.train_and_evaluate(config, workdir)
  assert {p: os.path.getmtime(p) for p in glob.glob(f"{workdir}/predictions/new_test-10/*")} == before


def test_a_tfds_datasets_predictions_are_named_by_the_dataset_not_its_data_dir():
  """data.data_dir of a tfds dataset is the root of all of them (mnist's and fashion_mnist's were one directory)."""
  from loops import evaluate_once
  config = load_config("digits_cnn")
  config.data.name, config.data.data_dir = "mnist", "/data/tensorflow_datasets"
  assert evaluate_once.input_name(config.data) == "mnist_test"
  config.data.name = "tfds:emnist/letters"
  assert evaluate_once.input_name(config.data) == "emnist_letters_test"
  assert evaluate_once.input_described(config.data) == "tfds:emnist/letters:test in /data/tensorflow_datasets"


class WrongRows(Task):
  """A predict_step whose output is one row per batch."""

  def per_example_loss(self, batch, models, ctx):
    return tf.reduce_mean(tf.cast(batch[0], tf.float32), axis=[1, 2, 3])

  def predict_step(self, batch, models, ctx):
    return {"mean": tf.reduce_mean(models["model"](batch[0]), axis=0, keepdims=True)}


@pytest.mark.e2e
@pytest.mark.parametrize("settings, message", [
    ({"checkpoint": "15"}, r"^predict.checkpoint=15: no checkpoint of step 15 in .*/w/checkpoints \(steps: 10, 20\)$"),
    ({"input": "/nowhere/images"}, r"^predict.input='/nowhere/images': no image files \(.png, .jpg, .*\) there$"),
])
def test_bad_input_is_one_line_and_nothing_is_written(trained, tmp_path, settings, message):
  config, workdir = predicting(trained, tmp_path, **settings)
  with pytest.raises(ConfigError, match=message):
    run.train_and_evaluate(config, workdir)
  assert not os.path.exists(f"{workdir}/predictions") or not os.listdir(f"{workdir}/predictions")


@pytest.mark.e2e
def test_outputs_of_another_length_than_the_batch_are_one_line(trained, tmp_path):
  config, workdir = predicting(trained, tmp_path)
  config.task.name = "tests.test_predict:WrongRows"
  config.data.num_classes, config.checkpoint.best_metric = 10, ""
  with pytest.raises(ConfigError, match=r"^WrongRows.predict_step \(.*test_predict.py:\d+\): output 'mean' has "
                                        r"shape \[1, 10\], not one row per example of the batch of 64"):
    run.train_and_evaluate(config, workdir)


def test_predict_settings_are_checked_before_anything_runs():
  from loops import rules
  config = load_config("digits_cnn")
  config.predict.rows_per_file = 0
  with pytest.raises(ConfigError, match=r"^predict.rows_per_file must be a whole number >= 1, got 0$"):
    rules.check(config)


@pytest.mark.e2e
def test_the_after_training_guide_runs_as_written(tmp_path):
  """docs/after_training.md's main.py commands and its numpy snippet, in order, runs/digits being a fresh folder
  (the quickstart's training in full, ~12 s)."""
  from PIL import Image
  from tests.conftest import run_command
  from tests.test_docs import main_commands
  guide = open(os.path.join(REPO, "docs/after_training.md")).read()
  runs, images = str(tmp_path / "runs"), tmp_path / "new_digits"
  images.mkdir()
  for i, image in enumerate(np.random.default_rng(0).integers(0, 256, size=(3, 8, 8), dtype=np.uint8)):
    Image.fromarray(image).save(images / f"{i}.png")
  done = []
  for _, _, arguments in main_commands(guide):
    arguments = [a.replace("runs/", f"{runs}/").replace("new_digits/", f"{images}/") for a in arguments]
    result = run_command([PY, "main.py", *arguments], timeout=300, merge_output=True)
    assert result.returncode == 0, result.stdout[-2000:]
    done.append(result.stdout)
  assert len(done) == 5 and "predicted 360 examples (360 this run)" in done[1]
  best = json.load(open(f"{runs}/digits/best/best.json"))["step"]
  assert "predicted 3 examples" in done[2] and os.path.exists(f"{runs}/digits/predictions/new_digits-{best}")
  assert os.path.exists(f"{runs}/digits/eval/digits_test/checkpoint-{best}.json")
  assert os.path.getsize(f"{runs}/digits_lite/export/model.tflite") > 100_000
  snippet = guide.split("```python\n", 1)[1].split("```", 1)[0].replace("runs/", f"{runs}/")
  printed = subprocess.run([PY, "-c", snippet], capture_output=True, text=True, timeout=120).stdout
  summary = json.load(open(f"{runs}/digits/summary.json"))
  assert float(printed) == pytest.approx(summary["eval/accuracy"], abs=1e-6)
