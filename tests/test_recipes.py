"""Research recipes: user losses, schedules, gradient accumulation, mixed precision, XLA, exports."""

import json
import math
import types
import os
import subprocess
import sys

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from loops import run
from loops.modeling import optimizers
import models
from tests.conftest import REPO, load_config
from tests.test_train import model_weights, scalars

FIXTURES = os.path.join(REPO, "tests", "fixtures", "user_losses")


def opt_config(**overrides):
  c = load_config("digits_cnn").optimizer
  c.update(overrides)
  return c


@pytest.mark.parametrize("rule, replicas, batch, expected_peak", [
    ("none", 4, 512, 0.1), ("linear_replicas", 4, 512, 0.4), ("linear_batch_256", 4, 512, 0.2),
    ("sqrt_replicas", 4, 512, 0.2)])
@pytest.mark.parametrize("schedule", ["constant", "piecewise", "cosine"])
def test_schedule_values_match_the_formula_for_every_scaling_rule(rule, replicas, batch, expected_peak, schedule):
  c = opt_config(learning_rate=0.1, lr_scaling=rule, schedule=schedule, warmup_epochs=1.0, decay_epochs=(4, 8),
                 decay_factor=0.5, final_lr_fraction=0.1)
  peak = optimizers.scaled_learning_rate(c, batch, replicas)
  assert peak == pytest.approx(expected_peak, rel=1e-12)
  steps_per_epoch, total = 10, 100
  lr = optimizers.learning_rate_schedule(c, peak, total, steps_per_epoch)

  def expected(step):
    if step < 10:
      return peak * step / 10
    if schedule == "constant":
      return peak
    if schedule == "piecewise":
      return peak * (1 if step <= 40 else 0.5 if step <= 80 else 0.25)
    fraction = (step - 10) / 90
    return peak * ((1 - 0.1) * 0.5 * (1 + math.cos(math.pi * fraction)) + 0.1)

  for step in (0, 5, 10, 11, 40, 41, 80, 81, 99, 100):
    assert float(lr(step)) == pytest.approx(expected(step), rel=1e-5, abs=1e-9), step


def test_constant_without_warmup_is_a_plain_float_and_bad_schedules_are_rejected():
  from loops import rules
  from loops import plan as plan_lib
  assert optimizers.learning_rate_schedule(opt_config(), 0.05, 100, 10) == 0.05

  def config(**optimizer):
    c = load_config("digits_cnn")
    c.optimizer.update(optimizer)
    return c

  with pytest.raises(ValueError, match="needs optimizer.decay_epochs in increasing order"):
    rules.check(config(schedule="piecewise", decay_epochs=(5, 2)))
  with pytest.raises(ValueError, match="unknown optimizer.schedule 'cosin' \\(did you mean 'cosine'\\?\\)"):
    rules.check(config(schedule="cosin"))
  long_warmup = config(warmup_epochs=60.0)  # 50 epochs of 22 steps
  source = types.SimpleNamespace(name="digits", train_size=1437, image_shape=(8, 8, 1), train_files=None, streams=None)
  with pytest.raises(ValueError, match="optimizer.warmup_epochs=60.0 gives 1320 warmup steps; it must be shorter "
                                       "than the run \\(1100 steps\\)"):
    rules.check_derived(long_warmup, plan_lib.derive(long_warmup.train, long_warmup.optimizer, 1, 1437), source)


def test_the_learning_rate_logged_is_the_one_used(tiny_digits, tmp_path):
  tiny_digits.optimizer.schedule, tiny_digits.optimizer.warmup_epochs = "cosine", 0.5  # 11 warmup steps
  tiny_digits.export = False  # read by its summaries (an export is 1-2 s a run)
  run.train_and_evaluate(tiny_digits, str(tmp_path))
  values, _ = scalars(str(tmp_path))
  lr = optimizers.learning_rate_schedule(tiny_digits.optimizer, 0.05, 20, 22)
  for step, logged in values["train/learning_rate"]:
    assert logged == pytest.approx(float(lr(step)), rel=1e-6)
  assert len(values["train/learning_rate"]) == 4


@pytest.mark.e2e
def test_a_user_loss_outside_the_framework_trains_digits_by_config_only(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(FIXTURES)
  c = load_config("digits_cnn")
  c.loss.name = "my_losses:focal_loss"
  c.loss.kwargs = ml_collections.ConfigDict({"gamma": 2.0})
  c.train.epochs = 15
  summary = run.train_and_evaluate(c, str(tmp_path))
  assert summary["eval/accuracy"] >= 0.93


def initial_weights(seed=0):
  keras.utils.set_random_seed(seed)
  return [v.numpy() for v in models.build("digits_cnn", (8, 8, 1), 10).trainable_variables]


@pytest.mark.e2e
def test_user_loss_gradients_agree_on_one_and_two_replicas(tiny_digits, tmp_path, monkeypatch):
  """One SGD step with lr 1 and no momentum: the weight change is minus the gradient."""
  monkeypatch.syspath_prepend(FIXTURES)
  tiny_digits.loss.name = "my_losses:focal_loss"
  tiny_digits.optimizer.learning_rate, tiny_digits.optimizer.momentum = 1.0, 0.0
  tiny_digits.train.steps, tiny_digits.train.steps_per_loop = 1, 1
  tiny_digits.eval.every_steps = tiny_digits.checkpoint.every_steps = 0
  tiny_digits.export = False  # compared by checkpoints (an export is 1-2 s a run)
  start = initial_weights()
  gradients = {}
  for name, replicas in (("one_device", 0), ("mirrored", 2)):
    tiny_digits.strategy, tiny_digits.cpu_replicas = name, replicas
    run.train_and_evaluate(tiny_digits, str(tmp_path / name))
    weights = model_weights(str(tmp_path / name))
    trained = [weights[k] for k in sorted(weights) if "_trainable_variables" in k]
    trained = sorted(trained, key=lambda w: w.shape)  # checkpoint key order is not layer order
    gradients[name] = {w0.shape: w0 - w1 for w0, w1 in zip(sorted(start, key=lambda w: w.shape), trained)}
  assert any(np.abs(g).max() > 1e-3 for g in gradients["one_device"].values())
  for shape, g in gradients["one_device"].items():
    np.testing.assert_allclose(gradients["mirrored"][shape], g, rtol=1e-6, atol=1e-6 * np.abs(g).max())


def test_a_reduced_user_loss_stops_the_run_with_the_contract(tiny_digits, tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(FIXTURES)
  tiny_digits.loss.name = "my_losses:reduced_loss"
  with pytest.raises(ValueError, match=r"loss 'my_losses:reduced_loss' returned shape \[\]; expected one loss per "
                                       r"example, shape \[4\]"):
    run.train_and_evaluate(tiny_digits, str(tmp_path))


@pytest.mark.e2e
def test_gradient_accumulation_equals_one_larger_batch(tiny_digits, tmp_path):
  tiny_digits.train.steps, tiny_digits.eval.every_steps, tiny_digits.checkpoint.every_steps = 5, 0, 0
  tiny_digits.export = False  # compared by checkpoints (an export is 1-2 s a run)
  weights = {}
  for k in (1, 4):
    tiny_digits.train.grad_accum_steps = k
    run.train_and_evaluate(tiny_digits, str(tmp_path / f"k{k}"))
    weights[k] = model_weights(str(tmp_path / f"k{k}"))
  for key, whole in weights[1].items():
    np.testing.assert_allclose(weights[4][key], whole, rtol=1e-6, atol=1e-7, err_msg=key)
  tiny_digits.train.grad_accum_steps = 3
  with pytest.raises(ValueError, match="train.grad_accum_steps=3 must be a positive integer dividing the "
                                       r"per-replica batch \(64\)"):
    run.train_and_evaluate(tiny_digits, str(tmp_path / "k3"))


@pytest.mark.e2e
@pytest.mark.parametrize("mixed_precision, jit", [("bfloat16", False), (None, True), ("bfloat16", True)])
def test_mixed_precision_and_xla_run_under_mirrored(mixed_precision, jit, tiny_digits, tmp_path):
  tiny_digits.strategy, tiny_digits.cpu_replicas = "mirrored", 2
  tiny_digits.mixed_precision, tiny_digits.jit_compile = mixed_precision, jit
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path))
  assert summary["step"] == 20 and math.isfinite(summary["train/loss"]) and summary["eval/accuracy"] > 0.2


@pytest.mark.e2e
def test_xla_gives_the_same_losses_as_without(tiny_digits, tmp_path):
  tiny_digits.train.steps, tiny_digits.train.steps_per_loop = 6, 1
  tiny_digits.eval.every_steps = tiny_digits.checkpoint.every_steps = 0
  tiny_digits.export = False  # compared by their losses (an export is 1-2 s a run)
  losses = {}
  for jit in (False, True):
    tiny_digits.jit_compile = jit
    run.train_and_evaluate(tiny_digits, str(tmp_path / str(jit)))
    losses[jit] = [v for _, v in scalars(str(tmp_path / str(jit)))[0]["train/loss"]]
  assert len(losses[True]) == 6
  np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4)


def test_mixed_precision_name_is_checked(tiny_digits, tmp_path):
  tiny_digits.mixed_precision = "fp16"
  with pytest.raises(ValueError, match="unknown mixed_precision 'fp16'; valid: None, bfloat16, float16"):
    run.train_and_evaluate(tiny_digits, str(tmp_path))


@pytest.mark.e2e
def test_export_reloads_in_a_fresh_process_and_reproduces_eval_accuracy(tiny_digits, tmp_path):
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path))
  script = (
      "import json, sys, keras, numpy as np\n"
      "import data\n"
      "from tests.conftest import load_config\n"
      "model = keras.models.load_model(sys.argv[1])\n"
      "cfg = load_config('digits_cnn').data\n"
      "source = data.load(cfg)\n"
      "correct = n = 0\n"
      "for images, labels, weights in data.eval_dataset(source, cfg, batch_size=64):\n"
      "  hit = (np.argmax(model(images), -1) == labels.numpy()) * weights.numpy()\n"
      "  correct += hit.sum(); n += weights.numpy().sum()\n"
      "print(json.dumps({'accuracy': float(correct / n), 'n': float(n)}))\n")
  result = subprocess.run([sys.executable, "-c", script, summary["export"]["keras"]], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  reloaded = json.loads(result.stdout.strip().splitlines()[-1])
  assert reloaded["n"] == 360
  assert reloaded["accuracy"] == pytest.approx(summary["eval/accuracy"], abs=1e-7)


def test_the_best_checkpoint_is_kept_apart(tiny_digits, tmp_path):
  tiny_digits.checkpoint.best_metric, tiny_digits.checkpoint.best_mode = "eval/loss", "min"
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path))
  record = json.load(open(tmp_path / "best" / "best.json"))
  values, _ = scalars(str(tmp_path))
  best_step, best_loss = min(values["eval/loss"], key=lambda sv: sv[1])
  assert (record["step"], record["value"]) == (best_step, pytest.approx(best_loss, rel=1e-6))
  assert summary["best_checkpoint"].endswith(f"best/ckpt-{best_step}")
  tiny_digits.checkpoint.best_metric = "eval/acuracy"
  with pytest.raises(ValueError, match="checkpoint.best_metric 'eval/acuracy' is not an eval metric"):
    run.train_and_evaluate(tiny_digits, str(tmp_path / "other"))
