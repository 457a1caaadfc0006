"""Research plug-ins keep the core invariant: a user model with named outputs, losses that read `images` /
`outputs` / `step`, mixup and cutmix, synchronized BatchNorm — one replica == mirrored x2 == 2-worker MWMS for the
same global batch (weights and every checkpointed variable within 1e-5 relative, momentum 0)."""

import os
import sys

import numpy as np
import pytest

from loops import run
from tests.conftest import REPO, load_config, pythonpath, run_command, set_keys
from tests.test_train import model_weights

USER_LOSSES = os.path.join(REPO, "tests", "fixtures", "user_losses")
NO_PERIODIC = {"eval.every_steps": 0, "checkpoint.every_steps": 0, "optimizer.momentum": 0.0, "deterministic": True}
# The examples' reconstruction model and ramped loss (images, outputs and step at once), with mixup and cutmix.
RESEARCH = {"model.name": "examples.models:cnn_with_embedding", "model.kwargs.reconstruct": True,
            "loss.name": "examples.losses:reconstruction_auxiliary", "loss.kwargs.ramp_steps": 3,
            "data.mixup_alpha": 0.4, "data.cutmix_alpha": 1.0}
# lr 0.01 (x 16/256 by the config's scaling rule): at the config's 0.1, ResNet-20 on noise at batch 16 amplifies
# float rounding ~100x per step (measured with sync on, in an earlier two-pass implementation of it: 1.2e-8 apart
# after step 1, 1.9e-6 after 2, 3.1e-5 after 3).
# ResNet-8 (one block per stage): the same layers as ResNet-20, a third of the tracing.
SYNC_BN = {"model.sync_batchnorm": True, "model.kwargs.blocks_per_stage": 1, "train.global_batch_size": 16,
           "train.steps": 3, "train.steps_per_loop": 3, "data.synthetic.train_examples": 256,
           "data.synthetic.eval_examples": 64, "optimizer.learning_rate": 0.01}


def configured(name, arg=None, **overrides):
  c = load_config(name, arg)
  c.train.epochs = None
  c.train.steps, c.train.steps_per_loop = 6, 3
  # no export (1-2 s a run): these runs are compared by their checkpoints, as mwms() says with --config.export=False
  return set_keys(c, {**NO_PERIODIC, "export": False, **overrides})


_ONE_DEVICE = {}  # a config's one-device weights: the uses_step run is one of two tests' (deterministic, 6 steps)


def trained(config, strategy, workdir):
  config.strategy, config.cpu_replicas = strategy, 2 if strategy == "mirrored" else 0
  key = config.to_json_best_effort(sort_keys=True)
  if strategy != "one_device" or key not in _ONE_DEVICE:
    run.train_and_evaluate(config, str(workdir))
    if strategy != "one_device":
      return model_weights(str(workdir))
    _ONE_DEVICE[key] = model_weights(str(workdir))
  return {name: value.copy() for name, value in _ONE_DEVICE[key].items()}


def mwms(workdir, config_file, overrides, env=None):
  """A 2-worker multi_worker_mirrored run of main.py through launch.local; returns its checkpointed variables."""
  flags = [f"--config.{key}={value}" for key, value in {**NO_PERIODIC, **overrides}.items()]
  command = [sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
             f"--config={config_file}", f"--workdir={workdir}", "--config.strategy=multi_worker_mirrored",
             "--config.summary.progress_bar=off", "--config.export=False", *flags]  # train.steps wins over epochs
  full_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  full_env.update(env or {})
  done = run_command(command, env=full_env, timeout=500)
  assert done.returncode == 0, done.stdout[-3000:]
  return model_weights(str(workdir))


def assert_same(reference, other, what):
  assert reference.keys() == other.keys()
  for key, value in reference.items():
    np.testing.assert_allclose(other[key], value, rtol=1e-5, atol=1e-7, err_msg=f"{what}: {key}")


@pytest.mark.e2e
@pytest.mark.parametrize("loss, model", [("keyword_losses:uses_images", "digits_cnn"),
                                         ("keyword_losses:uses_outputs", "examples.models:cnn_with_embedding"),
                                         ("keyword_losses:uses_step", "digits_cnn")])
def test_a_loss_keyword_gives_one_replicas_weights_on_two_replicas_and_two_workers(loss, model, tmp_path,
                                                                                    monkeypatch):
  monkeypatch.syspath_prepend(USER_LOSSES)
  overrides = {"loss.name": loss, "model.name": model}
  single = trained(configured("digits_cnn", **overrides), "one_device", tmp_path / "one")
  assert_same(single, trained(configured("digits_cnn", **overrides), "mirrored", tmp_path / "two"), loss)
  multi_worker = mwms(tmp_path / "mwms", "configs/digits_cnn.py", {"train.steps": 6, "train.steps_per_loop": 3,
                                                                   **overrides}, env={"PYTHONPATH": pythonpath(USER_LOSSES)})
  assert_same(single, multi_worker, f"{loss} on 2 workers")


@pytest.mark.e2e
def test_a_loss_sees_the_global_step_before_its_update(tmp_path, monkeypatch):
  """uses_step trains only the updates of steps 0 and 1: 6 steps of it leave the weights of 2 plain steps."""
  monkeypatch.syspath_prepend(USER_LOSSES)
  gated = trained(configured("digits_cnn", **{"loss.name": "keyword_losses:uses_step"}), "one_device", tmp_path / "a")
  plain = trained(configured("digits_cnn", **{"train.steps": 2, "train.steps_per_loop": 2}), "one_device",
                  tmp_path / "b")
  weights = [k for k in plain if "_trainable_variables" in k]
  assert len(weights) == 8
  for key in weights:
    np.testing.assert_allclose(gated[key], plain[key], rtol=1e-6, err_msg=key)
  assert not np.allclose(gated[weights[0]], trained(configured("digits_cnn"), "one_device", tmp_path / "c")[weights[0]])


@pytest.mark.e2e
def test_named_outputs_a_loss_reading_images_outputs_step_and_mixup_cutmix_on_one_two_and_two_mwms_workers(tmp_path):
  single = trained(configured("digits_cnn", **RESEARCH), "one_device", tmp_path / "one")
  assert_same(single, trained(configured("digits_cnn", **RESEARCH), "mirrored", tmp_path / "two"), "mirrored")
  assert_same(single, mwms(tmp_path / "mwms", "configs/digits_cnn.py",
                           {"train.steps": 6, "train.steps_per_loop": 3, **RESEARCH}), "mwms")


@pytest.mark.e2e
def test_sync_batchnorm_makes_two_replicas_and_two_workers_compute_one_replicas_resnet(tmp_path):
  """cifar_resnet20 with one block per stage on synthetic data, 3 steps of a global batch of 16: with
  model.sync_batchnorm the weights and the BatchNorm statistics equal one replica's on mirrored x2 and 2-worker MWMS
  (||a - b|| / ||a|| < 1e-5 over all weights, and over all moving statistics); without it (each replica's BatchNorm
  fused, on its half of the batch) they differ by more than that tolerance.
  Measured: sync on 4.8e-8 / 1.7e-8 (mirrored), 4.8e-8 / 1.8e-8 (MWMS); off 2.9e-5 / 3.3e-4."""
  single = trained(configured("cifar_resnet20", "synthetic", **SYNC_BN), "one_device", tmp_path / "one")
  synced = trained(configured("cifar_resnet20", "synthetic", **SYNC_BN), "mirrored", tmp_path / "two")
  unsynced = trained(configured("cifar_resnet20", "synthetic", **{**SYNC_BN, "model.sync_batchnorm": False}),
                     "mirrored", tmp_path / "off")
  multi_worker = mwms(tmp_path / "mwms", "configs/cifar_resnet20.py:synthetic", SYNC_BN)
  for other, what in ((synced, "mirrored"), (multi_worker, "mwms")):
    weights, statistics = relative_differences(single, other)
    assert weights < 1e-5 and statistics < 1e-5, (what, weights, statistics)
  weights, statistics = relative_differences(single, unsynced)
  assert weights > 1e-5 and statistics > 1e-4, ("without sync BN", weights, statistics)


def relative_differences(reference, other):
  """||a - b|| / ||a|| over all trainable weights, and over all BatchNorm moving statistics."""
  assert reference.keys() == other.keys()

  def relative(keys):
    return float(np.sqrt(sum(np.sum((other[k] - reference[k]) ** 2) for k in keys)) /
                 np.sqrt(sum(np.sum(reference[k] ** 2) for k in keys)))

  return relative([k for k in reference if "_trainable_variables" in k]), relative([k for k in reference if "moving_" in k])


@pytest.mark.e2e
def test_digits_with_mixup_still_reaches_95_percent(tmp_path):
  c = load_config("digits_cnn")
  c.data.mixup_alpha, c.summary.progress_bar = 0.2, "off"
  summary = run.train_and_evaluate(c, str(tmp_path))
  assert summary["eval/accuracy"] >= 0.95
  assert summary["train/accuracy"] > 0.7  # against the largest share of each soft label


def restored(config, directory, input_shape=(8, 8, 1), num_classes=10):
  """(model weights, optimizer moving averages) of the latest checkpoint in `directory`, restored into fresh objects
  built as a run builds them."""
  import tensorflow as tf
  from loops.modeling import model as model_lib
  from loops.modeling import optimizers
  model = model_lib.build_model(config.model, config.mixed_precision, input_shape, num_classes)
  optimizer = optimizers.build(config.optimizer, 0.1)
  optimizer.build(model.trainable_variables)
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=tf.Variable(0, dtype=tf.int64))
  checkpoint.restore(tf.train.latest_checkpoint(str(directory))).expect_partial()
  return [v.numpy() for v in model.trainable_variables], [a.numpy() for a in optimizers.moving_averages(optimizer)]


@pytest.mark.e2e
def test_weight_ema_is_evaluated_kept_best_exported_and_resumed_exactly(tiny_digits, tmp_path):
  import keras
  import data
  c = tiny_digits
  c.optimizer.ema_decay, c.deterministic, c.summary.progress_bar = 0.9, True, "off"
  c.checkpoint.best_metric, c.checkpoint.best_mode = "eval/loss", "min"
  summary = run.train_and_evaluate(c, str(tmp_path / "straight"))
  raw, averages = restored(c, tmp_path / "straight" / "checkpoints")
  assert any(np.max(np.abs(r - a)) > 1e-4 for r, a in zip(raw, averages))  # training went on from the raw weights
  exported = keras.models.load_model(str(tmp_path / "straight" / "export" / "model.keras"))
  for e, a in zip(exported.trainable_variables, averages):
    np.testing.assert_array_equal(e.numpy(), a)
  best_raw, best_averages = restored(c, tmp_path / "straight" / "best")
  for r, a in zip(best_raw, best_averages):
    np.testing.assert_array_equal(r, a)  # the best checkpoint's model holds the averages that were evaluated
  # eval/loss was computed with the averaged weights: the export reproduces it.
  rows = [(x, y) for images, labels, weights in data.eval_dataset(data.load(c.data), c.data, batch_size=64)
          for x, y, w in zip(images.numpy(), labels.numpy(), weights.numpy()) if w > 0]
  logits = exported.predict(np.stack([r[0] for r in rows]), verbose=0)
  losses = keras.losses.sparse_categorical_crossentropy(np.array([r[1] for r in rows]), logits, from_logits=True)
  assert summary["eval/loss"] == pytest.approx(float(np.mean(losses)), abs=1e-5)
  # Resume: 10 steps, then 10 more, is the straight run bit for bit (weights, slots, averages).
  c.train.steps = 10
  run.train_and_evaluate(c, str(tmp_path / "resumed"))
  c.train.steps = 20
  run.train_and_evaluate(c, str(tmp_path / "resumed"))
  straight, resumed = model_weights(str(tmp_path / "straight")), model_weights(str(tmp_path / "resumed"))
  assert resumed.keys() == straight.keys()
  for key in straight:
    np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)


@pytest.mark.e2e
def test_weight_ema_on_two_replicas_is_one_replicas(tmp_path):
  c = configured("digits_cnn", **{"optimizer.ema_decay": 0.8})
  assert_same(trained(c, "one_device", tmp_path / "one"), trained(c, "mirrored", tmp_path / "two"), "ema")


@pytest.mark.e2e
def test_a_plug_in_that_makes_tensorflow_state_when_imported_is_one_clear_error_under_mwms(tmp_path):
  command = [sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
             "--config=configs/digits_cnn.py", f"--workdir={tmp_path}", "--config.strategy=multi_worker_mirrored",
             "--config.loss.name=my_losses:nan_at_call"]  # my_losses makes a tf.Variable at import
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env["PYTHONPATH"] = pythonpath(USER_LOSSES)
  done = run_command(command, env=env, timeout=300)
  assert done.returncode == 1, done.stdout[-3000:]
  assert ("error: multi_worker_mirrored must be created before TensorFlow runs anything, but it already ran: usually "
          "a plug-in module") in done.stdout
