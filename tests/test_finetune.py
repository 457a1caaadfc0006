"""Warm start and freezing (init.*, train.freeze): a digits network trained for 150 steps is the source; fine-tunes
from its workdir, a checkpoint prefix, its export (.keras) and a .weights.h5 file, with the head re-initialised
(init.exclude) and the body frozen."""

import json
import logging
import os
import re
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import run
from loops.modeling import freeze as freeze_lib
from loops.persist import init_checkpoint
from loops.persist import starts
import models
from models import resnet
from tests.conftest import load_config, run_main, set_keys

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

QUIET = {"summary.progress_bar": "off", "eval.every_steps": 0, "checkpoint.every_steps": 0, "export": False,
         "deterministic": True}
HEAD_FRESH_BODY_FROZEN = {"init.exclude": ("logits",), "train.freeze": ("conv", "dense")}


def digits(steps, **overrides):
  c = load_config("digits_cnn")
  c.train.epochs = None
  return set_keys(c, {"train.steps": steps, **QUIET, **overrides})


def saved_arrays(workdir):
  """{variable path: array} of the model in a workdir's latest checkpoint (read by place, as init.checkpoint does)."""
  names = {place: v.path for place, v in init_checkpoint.model_variables(models.build("digits_cnn", (8, 8, 1), 10))
           .items()}
  source = init_checkpoint.read(workdir, twin=None)
  return {names[place]: array for place, array in source.arrays.items()}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("finetune") / "source")
  summary = run.train_and_evaluate(digits(150, **{"export": True, "eval.every_steps": 0}), workdir)
  assert summary["eval/accuracy"] > 0.9
  return workdir


@pytest.fixture(scope="module")
def finetuned(source, tmp_path_factory):
  """(workdir, summary) of 100 steps from the source's workdir: head fresh, body frozen."""
  workdir = str(tmp_path_factory.mktemp("finetune") / "finetuned")
  return workdir, run.train_and_evaluate(digits(100, **{"init.checkpoint": source}, **HEAD_FRESH_BODY_FROZEN),
                                         workdir)


def test_frozen_body_finetune_beats_the_same_steps_from_scratch(finetuned, tmp_path):
  _, summary = finetuned
  scratch = run.train_and_evaluate(digits(100, **HEAD_FRESH_BODY_FROZEN), str(tmp_path / "scratch"))
  assert summary["eval/accuracy"] >= 0.95
  assert scratch["eval/accuracy"] <= summary["eval/accuracy"] - 0.2  # measured: 0.98 vs 0.45


def test_counts_in_summary_json(finetuned):
  workdir, _ = finetuned
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert (summary["init/loaded"], summary["init/excluded"], summary["init/skipped_shape"],
          summary["init/not_in_checkpoint"], summary["init/not_in_model"]) == (6, 2, 0, 0, 0)
  head = 128 * 10 + 10
  assert summary["init/loaded_fraction"] == pytest.approx(1 - head / 151306, abs=1e-6)


def test_frozen_weights_are_bit_identical_and_the_head_trained(source, finetuned):
  before, after = saved_arrays(source), saved_arrays(finetuned[0])
  body = [name for name in before if "logits" not in name]
  assert len(body) == 6  # conv1, conv2, dense: kernel and bias
  for name in body:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
  assert not np.allclose(after["digits_cnn/logits/kernel"], before["digits_cnn/logits/kernel"], atol=1e-3)


def test_one_and_two_replicas_agree_on_a_frozen_body_finetune(source, finetuned, tmp_path):
  config = digits(100, **{"init.checkpoint": source, "strategy": "mirrored", "cpu_replicas": 2},
                  **HEAD_FRESH_BODY_FROZEN)
  run.train_and_evaluate(config, str(tmp_path / "two"))
  one, two = saved_arrays(finetuned[0]), saved_arrays(str(tmp_path / "two"))
  for name, value in one.items():
    np.testing.assert_allclose(two[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_shape_mismatch_is_skipped_and_a_resume_ignores_init(source, tmp_path, caplog):
  workdir = str(tmp_path / "narrow")
  config = digits(5, **{"init.checkpoint": source, "init.min_fraction": 0.0, "model.kwargs.hidden": 64})
  with caplog.at_level(logging.INFO):
    summary = run.train_and_evaluate(config, workdir)
  assert (summary["init/loaded"], summary["init/skipped_shape"]) == (5, 3)  # conv1, conv2, logits/bias
  assert "digits_cnn/dense/kernel [1024, 128]->[1024, 64]" in caplog.text
  caplog.clear()
  config = set_keys(config, {"train.steps": 10, "init.exclude": ("logits",)})  # init.* changed: harmless
  with caplog.at_level(logging.INFO):
    summary = run.train_and_evaluate(config, workdir)
  assert summary["step"] == 10 and summary["resumed_from_step"] == 5
  assert (summary["init/loaded"], summary["init/skipped_shape"]) == (5, 3)  # the first start's, not loaded again
  assert f"init.checkpoint '{source}' is ignored" in caplog.text
  assert starts.is_accepted("init.checkpoint") and not starts.is_accepted("train.freeze")


def test_too_little_loaded_is_one_line_error(source, tmp_path):
  workdir = tmp_path / "refused"
  done = run_main("--config=configs/digits_cnn.py", f"--workdir={workdir}", f"--config.init.checkpoint={source}",
                  "--config.model.kwargs.hidden=64", "--config.train.steps=5")
  assert done.returncode == 1
  lines = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, done.stderr[-2000:]
  assert lines[0].startswith(f"error: init.checkpoint '{source}' would load 22.1% of the model's weights "
                             f"(18826 of 85066 scalars; init.min_fraction=0.5): 3 of another shape")
  assert not (workdir / "checkpoints").exists() and not (workdir / "config.json").exists()


def test_a_checkpoint_prefix_reads_as_its_workdir(source):
  prefix = init_checkpoint.read(os.path.join(source, "checkpoints", "ckpt-150"), twin=None)
  latest = init_checkpoint.read(source, twin=None)
  assert prefix.arrays.keys() == latest.arrays.keys() and len(prefix.arrays) == 8
  for place, array in latest.arrays.items():
    np.testing.assert_array_equal(prefix.arrays[place], array)


@pytest.mark.parametrize("kind", ["keras", "weights"])
def test_keras_file_sources(kind, source, tmp_path):
  if kind == "keras":  # through tf.io.gfile from a non-local filesystem (copied to a local file for Keras)
    path = "ram://finetune/model.keras"
    tf.io.gfile.makedirs("ram://finetune")
    tf.io.gfile.copy(os.path.join(source, "export", "model.keras"), path, overwrite=True)
  else:
    path = str(tmp_path / "source.weights.h5")
    keras.models.load_model(os.path.join(source, "export", "model.keras")).save_weights(path)
  workdir = str(tmp_path / kind)
  summary = run.train_and_evaluate(digits(3, **{"init.checkpoint": path}, **HEAD_FRESH_BODY_FROZEN), workdir)
  assert (summary["init/loaded"], summary["init/excluded"], summary["init/not_in_checkpoint"]) == (6, 2, 0)
  before, after = saved_arrays(source), saved_arrays(workdir)
  np.testing.assert_array_equal(after["digits_cnn/conv2/kernel"], before["digits_cnn/conv2/kernel"])


@pytest.mark.parametrize("kind", ["model", "weights"])
def test_keras_2_h5_sources(kind, source, tmp_path):
  """A plain .h5 (Keras 2's format): a whole model (model.save("x.h5")) or its weights only."""
  model = keras.models.load_model(os.path.join(source, "export", "model.keras"))
  path = str(tmp_path / f"{kind}.h5")
  if kind == "model":
    model.save(path)
  else:
    import h5py
    from keras.src.legacy.saving import legacy_h5_format
    with h5py.File(path, "w") as f:
      legacy_h5_format.save_weights_to_hdf5_group(f, model)
  summary = run.train_and_evaluate(digits(3, **{"init.checkpoint": path}, **HEAD_FRESH_BODY_FROZEN),
                                   str(tmp_path / kind))
  assert (summary["init/loaded"], summary["init/excluded"], summary["init/not_in_checkpoint"]) == (6, 2, 0)
  before, after = saved_arrays(source), saved_arrays(str(tmp_path / kind))
  np.testing.assert_array_equal(after["digits_cnn/conv2/kernel"], before["digits_cnn/conv2/kernel"])


def test_a_file_named_keras_that_is_not_one_is_said_so(tmp_path):
  path = tmp_path / "model.keras"
  path.write_text("a text file, not a zip archive")
  done = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'run'}",
                  f"--config.init.checkpoint={path}", "--config.train.steps=5")
  assert done.returncode == 1
  lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert lines == [f"error: init.checkpoint '{path}' is not a valid .keras file (not the zip archive "
                   "keras.Model.save writes); give a workdir, a checkpoint prefix (.../checkpoints/ckpt-N), a .keras "
                   "file or a .weights.h5 (or .h5) file"], done.stderr[-2000:]
  assert not (tmp_path / "run" / "config.json").exists()


def test_an_exclude_matching_every_weight_is_said_so(source, tmp_path):
  done = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path / 'run'}",
                  f"--config.init.checkpoint={source}", "--config.init.exclude=('.*',)", "--config.train.steps=5")
  assert done.returncode == 1
  lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and lines[0].startswith(
      f"error: init.exclude ('.*',) excludes all 8 weights of the model: init.checkpoint '{source}' would load "
      "nothing; exclude only what must start fresh"), done.stderr[-2000:]


def test_missing_source_and_unknown_freeze_pattern_are_one_line_errors(tmp_path):
  with pytest.raises(ConfigError, match=r"init.checkpoint '.*nowhere' does not exist; give a workdir"):
    run.train_and_evaluate(digits(3, **{"init.checkpoint": str(tmp_path / "nowhere")}), str(tmp_path / "a"))
  with pytest.raises(ConfigError, match=r"train.freeze pattern 'body' matches no layer; layers: digits_cnn/conv1"):
    run.train_and_evaluate(digits(3, **{"train.freeze": ("body",)}), str(tmp_path / "b"))


@pytest.mark.parametrize("batchnorm_stats", [True, False])
def test_frozen_batchnorm_runs_in_inference_mode_unless_asked(batchnorm_stats):
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="body"),
                            keras.layers.BatchNormalization(name="body_bn"), keras.layers.Dense(2, name="head")])
  frozen = freeze_lib.freeze(model, ("body",), batchnorm_stats=batchnorm_stats)
  assert [p.split("/", 1)[1] for p in frozen] == ["body", "body_bn"]
  assert [v.path.split("/", 1)[1] for v in model.trainable_variables] == ["head/kernel", "head/bias"]
  bn = model.get_layer("body_bn")
  before = bn.moving_mean.numpy().copy()
  model(np.random.default_rng(0).normal(3.0, 1.0, (16, 4)).astype("float32"), training=True)
  assert np.array_equal(bn.moving_mean.numpy(), before) == batchnorm_stats


def test_imagenet_weights_missing_from_the_cache_name_file_place_and_url(tmp_path, monkeypatch):
  monkeypatch.setenv("KERAS_HOME", str(tmp_path))
  name = "resnet50v2_weights_tf_dim_ordering_tf_kernels_notop.h5"
  with pytest.raises(ConfigError, match=rf"place {name} in {tmp_path}/models/ \(download "
                                        rf"https://storage.googleapis.com/tensorflow/keras-applications/resnet/{name}"):
    models.build("resnet50v2", (32, 32, 3), 10, weights="imagenet")


def test_imagenet_weights_in_the_cache_are_used_with_a_new_head(tmp_path, monkeypatch):
  """A stand-in for Keras' cached file (same name and legacy h5 layout, one kernel set to 0.5) reaches the model."""
  from keras.src.legacy.saving import legacy_h5_format  # the layout Keras' application files use
  import h5py
  body = keras.applications.ResNet50V2(include_top=False, weights=None, input_shape=(32, 32, 3), pooling="avg")
  body.get_layer("conv1_conv").kernel.assign(np.full(body.get_layer("conv1_conv").kernel.shape, 0.5, "float32"))
  os.makedirs(tmp_path / "models")
  with h5py.File(tmp_path / "models" / "resnet50v2_weights_tf_dim_ordering_tf_kernels_notop.h5", "w") as f:
    legacy_h5_format.save_weights_to_hdf5_group(f, body)
  monkeypatch.setenv("KERAS_HOME", str(tmp_path))
  model = models.build("resnet50v2", (32, 32, 3), 7, weights="imagenet")
  assert model.output.shape == (None, 7) and model.layers[-1].name == "logits"
  assert np.all(model.get_layer("conv1_conv").kernel.numpy() == 0.5)


@pytest.mark.parametrize("optimizer_state", [False, True])
def test_optimizer_slots_are_taken_only_when_asked(source, optimizer_state):
  init = set_keys(load_config("digits_cnn"), {"init.checkpoint": source, "init.optimizer_state": optimizer_state,
                                              "init.exclude": ("logits",)}).init
  model = models.build("digits_cnn", (8, 8, 1), 10)
  optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
  optimizer.build(model.trainable_variables)
  _, counts = init_checkpoint.warm_start(init, model, optimizer, tf.distribute.get_strategy(), twin=None)
  assert bool(init_checkpoint.read(source, twin=None, slots=optimizer_state).slots) == optimizer_state  # read only
  assert init_checkpoint.read(source, twin=None).slots == {}  # when asked
  saved = tf.train.load_checkpoint(os.path.join(source, "checkpoints")).get_tensor("optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE")
  assert saved.shape == (3, 3, 1, 32) and np.abs(saved).max() > 0  # conv1's kernel momentum in the source
  conv1_momentum, logits_momentum = optimizer.momentums[0].numpy(), optimizer.momentums[-2].numpy()
  if optimizer_state:
    assert counts["init/optimizer_slots"] == 6  # the loaded variables' momentums; the excluded head's stay 0
    np.testing.assert_array_equal(conv1_momentum, saved)
  else:
    assert "init/optimizer_slots" not in counts and not conv1_momentum.any()
  assert not logits_momentum.any()


def test_a_damaged_source_checkpoint_is_one_line(source, tmp_path):
  prefix = tf.train.latest_checkpoint(os.path.join(source, "checkpoints"))
  for path in tf.io.gfile.glob(prefix + ".*"):
    shutil.copy(path, tmp_path)
  [data] = tmp_path.glob("*.data-*")
  with open(data, "r+b") as f:
    f.truncate(os.path.getsize(data) // 2)
  copy = str(tmp_path / os.path.basename(prefix))
  with pytest.raises(ConfigError, match=rf"^init.checkpoint '{re.escape(copy)}' cannot be read \(\w+Error: .*\); "
                                        r"give an intact checkpoint") as raised:
    init_checkpoint.read(copy, twin=None)
  assert "\n" not in str(raised.value)


def test_adams_moments_are_taken_when_asked(tmp_path):
  """Keras 3 keeps Adam's state in `_momentums` and `_velocities` (SGD's in `momentums`)."""
  adam = {"optimizer.name": "adam", "optimizer.learning_rate": 0.003}
  source = str(tmp_path / "adam")
  run.train_and_evaluate(digits(10, **adam), source)
  init = set_keys(load_config("digits_cnn"), {"init.checkpoint": source, "init.optimizer_state": True}).init
  model = models.build("digits_cnn", (8, 8, 1), 10)
  optimizer = keras.optimizers.Adam(0.003)
  optimizer.build(model.trainable_variables)
  _, counts = init_checkpoint.warm_start(init, model, optimizer, tf.distribute.get_strategy(), twin=None)
  assert counts["init/optimizer_slots"] == 2 * 8  # a first and a second moment for each of the 8 variables
  reader = tf.train.load_checkpoint(os.path.join(source, "checkpoints"))
  for state in (optimizer._momentums, optimizer._velocities):  # pylint: disable=protected-access
    assert all(np.abs(v.numpy()).max() > 0 for v in state)
  saved = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("optimizer/_variables/")]
  momentum = optimizer._momentums[0].numpy()  # pylint: disable=protected-access
  assert sum(a.shape == momentum.shape and np.array_equal(a, momentum) for a in saved) == 1


def test_dry_run_reports_what_would_be_loaded_and_trained(source, tmp_path):
  report = run.train_and_evaluate(digits(5, **{"init.checkpoint": source}, **HEAD_FRESH_BODY_FROZEN),
                                  str(tmp_path / "dry"), dry_run=True)
  assert report["trained_parameters"] == 128 * 10 + 10
  assert report["init"].endswith("ckpt-150: {'init/loaded': 6, 'init/skipped_shape': 0, 'init/excluded': 2, "
                                 "'init/not_in_checkpoint': 0, 'init/not_in_model': 0, 'init/loaded_fraction': "
                                 "0.991474}")
  assert not (tmp_path / "dry").exists()
