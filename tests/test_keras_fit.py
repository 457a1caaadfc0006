"""Models as Keras fit users have them (loops/modeling/keras_fit.py): a compile()d model trains its own loss and
metrics (loss.name=""), alike on one and two replicas; what compile() or a fit override sets that the run does not
use is one line; Keras' fit step called inside the framework's step is one error line, not a placeholder crash."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import build as build_lib
from loops import rules as rules_lib
from loops import replica_check
from loops import run
from loops import task as task_lib
from loops.distribute import cluster
from loops.modeling import losses
from loops.persist import starts
from tests.conftest import load_config, run_main, set_keys

MODELS = "tests.fixtures.keras_fit_models:"


def digits(model, **overrides):
  config = load_config("digits_cnn")
  return set_keys(config, {"model.name": MODELS + model, "train.global_batch_size": 32, **overrides})


def built(config):
  rules_lib.check(config)
  return build_lib.build(config, cluster.ClusterRole())


@pytest.mark.e2e
def test_a_compiled_model_on_two_replicas_computes_what_one_does():
  """Per example, averaged over the global batch: the replica check's 3 SGD steps agree variable by variable."""
  lines = []
  assert replica_check.run(digits("compiled_probabilities"), out=lines.append), "\n".join(lines)
  assert lines[-1].startswith("replicas: PASS"), lines[-1]


def test_the_compiled_loss_and_metrics_are_what_the_run_trains_and_reports(caplog):
  parts = built(digits("compiled_probabilities"))
  images = tf.random.stateless_uniform([6, 8, 8, 1], seed=(1, 2))
  labels = tf.constant([0, 1, 2, 3, 4, 5], tf.int64)
  probabilities = parts.main_model(images)
  trained = parts.task.loss_fn(labels, probabilities).numpy()
  assert trained.shape == (6,)  # per example: the framework averages over the global batch
  keras_own = parts.main_model.compute_loss(x=images, y=labels, y_pred=probabilities)  # Keras fit's loss (weight 0.5)
  assert trained.mean() == pytest.approx(float(keras_own), rel=1e-5)
  unweighted = losses.sparse_categorical_crossentropy(labels, probabilities).numpy()  # the default loss.name's
  assert trained.mean() == pytest.approx(0.5 * unweighted.mean(), rel=1e-5)
  assert list(parts.eval_metrics) == ["loss", "accuracy", "top5_accuracy", "top3"]
  assert isinstance(parts.eval_metrics["top3"], keras.metrics.SparseTopKCategoricalAccuracy)
  messages = [r.getMessage() for r in caplog.records]
  assert "model 'model' was compile()d; not used: optimizer Adam (optimizer.name='sgd', learning_rate 0.05 trains " \
         "it)" in messages
  assert any(m.startswith("model 'probabilities' was compile()d: the run trains its loss per example over the global "
                          "batch, reports eval/loss, ") for m in messages), messages


def test_every_compiled_setting_the_run_does_not_use_is_named_with_what_it_uses(caplog):
  """compile(optimizer=SGD()) trained silently at the config's learning rate 0.05 and momentum 0.9."""
  parts = built(digits("compiled_settings", **{"loss.name": ""}))
  assert parts.plan.learning_rate == 0.05 and float(parts.optimizers["model"].momentum) == 0.9  # what the line says
  warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model 'model' was compile()d;")]
  assert warnings == [
      "model 'model' was compile()d; not used: the compiled SGD's learning_rate 0.01 (the run's: 0.05), momentum 0 "
      "(the run's: 0.9) (optimizer.* set what trains: set them there to train these); run_eagerly=True (the step "
      "always runs as a tf.function: a Python error in it names its line with --debug); jit_compile=True "
      "(--config.jit_compile=True sets it); steps_per_execution=4 (train.steps_per_loop=50 is what a call runs)"]
  caplog.clear()
  built(digits("compiled_settings", **{"loss.name": "", "optimizer.learning_rate": 0.01, "optimizer.momentum": 0.0,
                                       "jit_compile": True, "train.steps_per_loop": 4}))
  assert [r.getMessage() for r in caplog.records if "not used" in r.getMessage()] == [
      "model 'model' was compile()d; not used: run_eagerly=True (the step always runs as a tf.function: a Python "
      "error in it names its line with --debug)"]


def test_a_compiled_metric_named_like_another_of_eval_metrics_is_refused_not_dropped():
  with pytest.raises(ConfigError) as raised:
    built(digits("compiled_clashing_metric", **{"loss.name": ""}))
  assert str(raised.value) == (
      "model 'clashing' was compiled with metric 'top5_accuracy' (SparseTopKCategoricalAccuracy(k=2)); eval.metrics "
      "has another 'top5_accuracy' (SparseTopKCategoricalAccuracy(k=5)): rename one")


@pytest.mark.parametrize("name", ["compiled_tempered", "compiled_tempered_with_config"])
def test_a_users_compiled_loss_trains_with_its_own_arguments(name):
  """A Loss with a temperature, with or without get_config: copied through Keras serialization, the first came
  back at temperature 1 and the second failed on `reduction`."""
  from tests.fixtures import keras_fit_models

  parts = built(digits(name, **{"loss.name": ""}))
  logits = tf.random.stateless_normal([4, 10], seed=(1, 2))
  labels = tf.constant([0, 1, 2, 3], tf.int64)
  expected = keras.losses.sparse_categorical_crossentropy(labels, logits / 0.05, from_logits=True)
  np.testing.assert_allclose(parts.task.loss_fn(labels, logits).numpy(), expected.numpy(), rtol=1e-5)
  users = parts.main_model.loss
  assert isinstance(users, keras_fit_models.Tempered) and users.reduction == "sum_over_batch_size"  # left as it was


def test_a_compiled_metric_whose_get_config_leaves_out_an_argument_is_refused_not_reset():
  with pytest.raises(ConfigError) as raised:
    built(digits("compiled_metric_without_its_argument", **{"loss.name": ""}))
  assert str(raised.value) == (
      "model 'tempered' was compiled with metric AboveThreshold, whose get_config() leaves out its constructor "
      "argument 'threshold': the run makes its own copy of every compiled metric from get_config(), which would reset "
      "it; return 'threshold' from get_config()")


def summary_of(tmp_path, strategy):
  config = digits("compiled", **{"train.epochs": None, "train.steps": 30, "train.steps_per_loop": 10,
                                 "eval.every_steps": 30, "checkpoint.every_steps": 30, "deterministic": True,
                                 "strategy": strategy, "cpu_replicas": 2 if strategy == "mirrored" else 0,
                                 "export": False})
  run.train_and_evaluate(config, str(tmp_path / strategy))
  return json.load(open(tmp_path / strategy / "summary.json"))


@pytest.mark.e2e
def test_a_compiled_model_learns_the_same_on_one_device_and_mirrored_x2(tmp_path):
  one, two = summary_of(tmp_path, "one_device"), summary_of(tmp_path, "mirrored")
  assert one["eval/accuracy"] > 0.5, one  # it learns (10 classes: chance is 0.1)
  for key in ("train/loss", "eval/loss", "eval/accuracy"):
    assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key


def test_a_loss_name_wins_over_the_compiled_loss_and_a_train_step_override_is_named(caplog):
  parts = built(digits("own_step", **{"loss.name": "focal"}))
  outputs, labels = parts.main_model(tf.ones([3, 8, 8, 1])), tf.constant([1, 2, 3], tf.int64)
  np.testing.assert_allclose(parts.task.loss_fn(labels, outputs), losses.focal(labels, outputs), rtol=1e-6)
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert ("model 'own_step' was compiled with loss SparseCategoricalCrossentropy(from_logits=True); the run trains "
          "loss.name='focal' (the config's; loss.name='' trains the compiled one)") in warnings
  overrides = [w for w in warnings if "overrides train_step" in w]
  assert len(overrides) == 1 and "OwnStep (" in overrides[0] and overrides[0].endswith(
      "port it to a Task (docs/migrating.md 'Coming from Keras fit')"), warnings


def test_loss_settings_for_another_loss_are_refused_with_a_compiled_loss():
  with pytest.raises(ConfigError, match=r"^loss.label_smoothing/loss.kwargs configure loss.name's loss; model "
                                        r"'compiled' trains its compiled SparseCategoricalCrossentropy"):
    built(digits("compiled", **{"loss.label_smoothing": 0.1}))


@pytest.mark.e2e
def test_keras_fit_step_called_from_a_task_step_on_two_replicas_is_one_line(tmp_path):
  result = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path}", "--config.strategy=mirrored",
                    "--config.cpu_replicas=2", f"--config.task.name={MODELS}CallsFitStep", "--config.train.steps=4",
                    "--config.train.steps_per_loop=2", "--config.checkpoint.best_metric=", "--config.export=False")
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: CallsFitStep.train_step (") and "calls models['model'].train_step: Keras fit's " \
         "step (OwnStep) cannot run inside the framework's step" in last and last.endswith("'Coming from Keras fit')")
  assert "Placeholder" not in result.stderr


class _Probed(task_lib.Task):
  called = False

  def eval_step(self, batch, models, ctx):
    _Probed.called = True
    return {"loss": tf.zeros([2])}


def test_the_probe_says_when_it_cannot_make_the_zero_batch_itself():
  spec = (tf.TensorSpec([3], tf.variant), tf.TensorSpec([], tf.int64))
  with pytest.raises(ConfigError, match=r"^the framework could not build a probe batch of zeros for the examples "
                                        r".*\(not your eval_step\)"):
    task_lib.eval_names(_Probed(), {}, spec, 4, {})
  assert not _Probed.called


def test_a_record_of_the_old_loss_default_resumes_under_the_new_one():
  assert starts.compare({"loss.name": "sparse_categorical_crossentropy"}, {"loss.name": ""}) == ([], [])
  refused, _ = starts.compare({"loss.name": "sparse_categorical_crossentropy"}, {"loss.name": "focal"})
  assert refused == [("loss.name", "sparse_categorical_crossentropy", "focal")]
