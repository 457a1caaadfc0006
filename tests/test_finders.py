"""The finders (`main.py --find=lr|batch_size`): the pure batch search against simulated out-of-memory, the LR
range test's ramp, smoothing, stop and suggestion, then end-to-end runs on digits (one_device and mirrored x2 for
the range test, a CPU memory budget for the batch search)."""

import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from configs import settings
from errors import ConfigError
from loops import finders
from loops.core import batch_search
from loops.finders import lr_range
from tests.conftest import load_config, run_command, run_main, set_keys

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)


def fake_fits(threshold, log):
  """A device on which a batch fits when it is at most `threshold` (log collects every size tried)."""
  def fits(size):
    log.append(size)
    return size <= threshold
  return fits


@pytest.mark.parametrize("threshold, granularity, expected", [
    (100, 8, 96), (128, 8, 128), (129, 8, 128), (8, 8, 8), (1000, 8, 1000), (4095, 8, 4088), (777, 1, 777),
    (63, 16, 48), (300, 32, 288)])
def test_search_finds_the_largest_fitting_multiple(threshold, granularity, expected):
  log = []
  result = batch_search.largest_fitting(fake_fits(threshold, log), start=granularity, maximum=4096,
                                        granularity=granularity)
  assert result.largest == expected
  assert result.first_failure == expected + granularity
  assert len(log) == len(set(log)) == len(result.tried)  # each size once
  assert len(log) <= 2 * math.log2(4096 / granularity) + 2
  assert [size for size, _ in result.tried] == log and all(fit == (size <= threshold) for size, fit in result.tried)


def test_search_doubles_then_bisects_in_that_order():
  log = []
  result = batch_search.largest_fitting(fake_fits(100, log), start=8, maximum=4096, granularity=8)
  assert log == [8, 16, 32, 64, 128, 96, 112, 104]
  assert result.largest == 96


def test_search_stops_at_the_maximum_and_caps_the_last_doubling():
  log = []
  result = batch_search.largest_fitting(fake_fits(10 ** 9, log), start=8, maximum=1000, granularity=8)
  assert log == [8, 16, 32, 64, 128, 256, 512, 1000]
  assert (result.largest, result.first_failure) == (1000, None)
  log = []
  result = batch_search.largest_fitting(fake_fits(10 ** 9, log), start=8, maximum=1003, granularity=8)
  assert log[-1] == 1000 and result.largest == 1000  # the maximum rounded down to a multiple


def test_search_bisects_below_a_start_that_does_not_fit():
  log = []
  result = batch_search.largest_fitting(fake_fits(5, log), start=8, maximum=64, granularity=1)
  assert log == [8, 4, 6, 5] and result.largest == 5
  result = batch_search.largest_fitting(fake_fits(3, []), start=8, maximum=64, granularity=8)
  assert (result.largest, result.first_failure) == (0, 8)


def test_search_rejects_bad_bounds():
  with pytest.raises(ValueError, match="start a multiple of granularity"):
    batch_search.largest_fitting(lambda size: True, start=12, maximum=64, granularity=8)
  with pytest.raises(ValueError, match="maximum=4"):
    batch_search.largest_fitting(lambda size: True, start=8, maximum=4, granularity=8)


def test_ramp_is_exponential_in_the_step_in_and_out_of_the_graph():
  ramp = lr_range.ExponentialRamp(1e-6, 1.0, 7)
  expected = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1.0]
  np.testing.assert_allclose([ramp.at(step) for step in range(8)], expected, rtol=1e-12)
  in_graph = tf.function(lambda step: ramp(step))
  np.testing.assert_allclose([float(in_graph(tf.constant(step, tf.int64))) for step in range(8)], expected,
                             rtol=1e-5)


def test_curve_smooths_with_bias_correction_and_stops_on_divergence():
  curve = lr_range.Curve()
  assert curve.add(1e-3, 2.0, beta=0.5, diverge_factor=4.0)
  assert curve.smoothed[0] == pytest.approx(2.0)  # bias-corrected: the first value is the loss itself
  assert curve.add(1e-2, 1.0, beta=0.5, diverge_factor=4.0)
  assert curve.smoothed[1] == pytest.approx((0.5 * 0.5 * 2.0 + 0.5 * 1.0) / (1 - 0.25))
  assert curve.add(1e-1, 6.0, beta=0.5, diverge_factor=4.0)  # (0.5 x 1 + 0.5 x 6) / 0.875 = 4: under 4 x 1.33
  assert curve.smoothed[2] == pytest.approx(4.0)
  assert not curve.add(1.0, 40.0, beta=0.5, diverge_factor=4.0)  # (0.5 x 3.5 + 0.5 x 40) / 0.9375 = 23.2
  assert curve.stop_reason == "the smoothed loss 23.2 exceeded 4 x its lowest 1.333 at lr 1"
  nan_curve = lr_range.Curve()
  assert nan_curve.add(1e-3, 2.0, 0.9, 4.0) and not nan_curve.add(1e-2, float("nan"), 0.9, 4.0)
  assert "not finite" in nan_curve.stop_reason


def test_suggestion_is_the_steepest_descent_before_the_minimum():
  learning_rates = list(np.logspace(-6, 0, 121))
  log_lr = np.log10(learning_rates)
  # falls fastest at 1e-3, lowest near 1e-1.5, then rises steeply (a rise must not be taken for a descent)
  smoothed = list(2.0 - np.tanh(2 * (log_lr + 3)) + np.where(log_lr > -1.5, 10 * (log_lr + 1.5) ** 2, 0))
  suggestion, lowest = lr_range.suggest(learning_rates, smoothed)
  assert suggestion == pytest.approx(1e-3, rel=0.13)
  assert lowest == pytest.approx(10 ** -1.5, rel=0.3)
  assert lr_range.suggest([1e-3, 1e-2], [2.0, 3.0]) == (None, 1e-3)  # nothing falls: no suggestion


LR_RUN = dict(lr_min=1e-3, lr_max=10.0, lr_steps=80, smoothing=0.9, diverge_factor=1.5)


def digits_for_lr(strategy="one_device", replicas=0, **find):
  c = load_config("digits_cnn")
  c.strategy, c.cpu_replicas = strategy, replicas
  c.find.update(find)
  return c


@pytest.fixture(scope="module")
def lr_runs(tmp_path_factory):
  """The range test on digits up to lr 10, on one_device and on mirrored x2 (same global batch). digits' ReLU
  network saturates near ln(10) = 2.3 past lr ~1 instead of exploding: a factor of 1.5 stops it there."""
  runs = {}
  for strategy, replicas in (("one_device", 0), ("mirrored", 2)):
    workdir = str(tmp_path_factory.mktemp(strategy))
    config = digits_for_lr(strategy, replicas, **LR_RUN)
    runs[strategy] = workdir, finders.find("lr", config, workdir)
  return runs


def test_range_test_writes_the_curve_and_never_a_checkpoint(lr_runs, capsys):
  workdir, result = lr_runs["one_device"]
  out = os.path.join(workdir, "lr_find")
  assert sorted(os.listdir(workdir)) == ["lr_find"]  # nothing else in the workdir: no checkpoints, no config
  with open(os.path.join(out, "lr_find.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(os.path.join(out, "lr_find.json")) as f:
    saved = json.load(f)
  assert saved["suggested_lr"] == result["suggested_lr"] and saved["rule"] == lr_range.RULE
  from tests.test_train import scalars
  tags = scalars(out)[0]
  assert len(tags["lr_find/loss"]) == result["steps"] == len(saved["losses"])
  np.testing.assert_allclose([v for _, v in tags["lr_find/learning_rate"]], result["learning_rates"], rtol=1e-6)


def test_range_test_ramps_stops_on_divergence_and_suggests(lr_runs):
  _, result = lr_runs["one_device"]
  rates = np.asarray(result["learning_rates"])
  np.testing.assert_allclose(rates[1:] / rates[:-1], (10.0 / 1e-3) ** (1 / 79), rtol=1e-9)
  assert rates[0] == pytest.approx(1e-3)
  assert 10 < result["steps"] < 80 and "exceeded 1.5 x its lowest" in result["stop_reason"]
  smoothed = [s for s in result["smoothed_losses"] if s is not None]
  assert smoothed[-1] > 1.5 * min(smoothed)
  assert all(value <= 1.5 * min(smoothed[:i + 1]) for i, value in enumerate(smoothed[:-1]))  # not sooner
  assert rates[2] <= result["suggested_lr"] < result["lowest_loss_lr"] <= rates[-1]
  at_suggestion = smoothed[result["learning_rates"].index(result["suggested_lr"])]
  assert at_suggestion < smoothed[0] - 0.05  # the loss is already falling there
  assert result["flag_value"] == result["suggested_lr"]  # lr_scaling "none": the flag is the rate itself


def test_range_test_is_the_same_on_two_replicas(lr_runs):
  one, two = lr_runs["one_device"][1], lr_runs["mirrored"][1]
  assert two["lr_scaling"] == 1.0
  steps = min(one["steps"], two["steps"], 60)
  steps = int(np.argmin(one["losses"][:steps]))  # up to the lowest loss: past it, divergence amplifies rounding
  assert steps >= 20, one["losses"]
  np.testing.assert_allclose(two["losses"][:steps // 2], one["losses"][:steps // 2], rtol=2e-3)  # low rates
  np.testing.assert_allclose(two["losses"][:steps], one["losses"][:steps], rtol=1e-2)  # rates near the edge


def test_range_test_on_two_workers_matches_one_device_and_only_the_chief_writes(lr_runs, tmp_path):
  import subprocess
  import sys
  from tests.conftest import REPO
  flags = [f"--config.find.{key}={value}" for key, value in LR_RUN.items()]
  command = [sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
             "--config=configs/digits_cnn.py", f"--workdir={tmp_path}", "--find=lr",
             "--config.strategy=multi_worker_mirrored", *flags]
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  done = run_command(command, env=env, timeout=500)
  assert done.returncode == 0, done.stdout[-3000:]
  assert done.stdout.count("--config.optimizer.learning_rate=") == 1  # printed by the chief alone
  out = tmp_path / "lr_find"
  assert len([name for name in os.listdir(out) if name.startswith("events.out.tfevents")]) == 1
  with open(out / "lr_find.json") as f:
    two_workers = json.load(f)
  one = lr_runs["one_device"][1]
  steps = min(one["steps"], two_workers["steps"], 60)
  np.testing.assert_allclose(two_workers["losses"][:steps], one["losses"][:steps], rtol=2e-3)
  assert abs(two_workers["steps"] - one["steps"]) <= 3  # the same divergence, give or take float noise


def test_range_test_prints_the_flag_with_lr_scaling(tmp_path, capsys):
  config = digits_for_lr(lr_min=1e-3, lr_max=1.0, lr_steps=30, smoothing=0.5)
  config.optimizer.lr_scaling = "linear_batch_256"  # batch 64: the run multiplies the flag by 0.25
  result = finders.find("lr", config, str(tmp_path))
  printed = capsys.readouterr().out
  assert result["lr_scaling"] == 0.25 and result["flag_value"] == pytest.approx(4 * result["suggested_lr"])
  assert f"--config.optimizer.learning_rate={result['flag_value']:.3g}" in printed
  assert "steepest descent of the smoothed loss" in printed


@pytest.mark.parametrize("what, keys, message", [
    ("lr", {"find.lr_min": 1.0, "find.lr_max": 0.1}, "0 < lr_min < lr_max, got 1.0, 0.1"),
    ("lr", {"find.lr_steps": 3}, "find.lr_steps must be an integer >= 10, got 3"),
    ("batch_size", {}, "needs a memory budget.*--config.find.memory_budget_gb=GB"),
    ("batch_size", {"find.memory_budget_gb": 1.0, "strategy": "multi_worker_mirrored"}, "measures one machine"),
    ("lr", {"strategy": "parameter_server"}, "needs a synchronous strategy")])
def test_bad_finder_settings_are_one_line_errors(what, keys, message, tmp_path):
  config = set_keys(load_config("digits_cnn"), keys)
  with pytest.raises(ConfigError, match=message):
    finders.find(what, config, str(tmp_path))
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("keys", [{"num_gpus": 0}, {"cpu_replicas": 2, "strategy": "mirrored"}])
def test_batch_size_on_a_gpu_machine_with_cpu_replicas_is_a_cpu_search(keys, tmp_path, monkeypatch):
  """The machine has a GPU (faked), the replicas are CPUs: the CPU rules hold (a memory budget), not GPU:0's."""
  from loops.finders import trial
  monkeypatch.setattr(trial, "has_gpu", lambda: True)
  assert trial.replicas_on_gpu(settings.read(load_config("digits_cnn")).run)
  config = set_keys(load_config("digits_cnn"), keys)
  assert not trial.replicas_on_gpu(settings.read(config).run)
  with pytest.raises(ConfigError, match="needs a memory budget"):
    finders.find("batch_size", config, str(tmp_path))


def test_a_workdir_with_checkpoints_is_refused_as_output(tmp_path):
  os.makedirs(tmp_path / "lr_find" / "checkpoints")
  with pytest.raises(ConfigError, match="holds checkpoints: it is a training workdir"):
    finders.find("lr", digits_for_lr(lr_steps=10), str(tmp_path))


def test_batch_size_search_on_cpu_under_a_budget(tmp_path):
  """CLI end to end: doubling from 64 per replica (at most 512) under a 45 MB budget, then bisection; the table
  and the flag printed. Measured memory is noisy, so the assertions hold for any outcome of the search."""
  completed = run_main("--config=configs/digits_cnn.py", f"--workdir={tmp_path}", "--find=batch_size",
                       "--config.find.memory_budget_gb=0.045", "--config.find.granularity=64",
                       "--config.find.timed_steps=2", "--config.find.max_per_replica_batch=512")
  assert completed.returncode == 0, completed.stderr[-2000:]
  with open(tmp_path / "batch_size_find" / "batch_size_find.json") as f:
    result = json.load(f)
  trials = {t["per_replica_batch"]: t for t in result["trials"]}
  largest = result["largest_per_replica_batch"]
  assert largest % 64 == 0 and trials[largest]["fits"]
  assert [t["per_replica_batch"] for t in result["trials"]][:2] == [64, 128]  # doubling from the granularity
  if result["first_failure"]:  # the bisection ended between a fit and a failure one granularity apart
    assert result["first_failure"] == largest + 64 and not trials[largest + 64]["fits"]
    assert trials[largest + 64]["memory_gb"] > 0.045
  else:
    assert largest == result["maximum_tried"] == 512
  for t in result["trials"]:
    assert t["fits"] == (t["memory_gb"] <= 0.045) and t["images_per_second"] > 0
  assert trials[128]["step_mb"] > trials[64]["step_mb"] > 0  # the allocator's step memory grows with the batch
  assert f"--config.train.global_batch_size={largest}" in completed.stdout
  assert re.search(rf"^ +{largest} +{largest} +yes ", completed.stdout, re.M)  # the table of sizes tried


def test_finder_settings_are_harmless_on_resume():
  from loops.persist import starts
  refused, accepted = starts.compare({"find.lr_max": 1.0}, {"find.lr_max": 10.0, "find.granularity": 16})
  assert refused == [] and [key for key, _, _ in accepted] == ["find.granularity", "find.lr_max"]


def test_a_trained_workdir_keeps_its_files_byte_for_byte(tiny_digits, tmp_path):
  from loops import run
  import hashlib
  workdir = str(tmp_path / "run")
  run.train_and_evaluate(tiny_digits, workdir)

  def files():
    found = {}
    for root, _, names in os.walk(workdir):
      for name in names:
        path = os.path.join(root, name)
        with open(path, "rb") as f:
          found[os.path.relpath(path, workdir)] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns)
    return found

  before = files()
  assert any(name.startswith("checkpoints/ckpt-20") for name in before)
  finders.find("lr", set_keys(tiny_digits, {"find.lr_steps": 12}), workdir)
  after = files()
  assert {name: value for name, value in after.items() if not name.startswith("lr_find/")} == before
  assert "lr_find/lr_find.json" in after


def test_the_range_test_ramps_every_optimizer_of_a_task_at_its_ratio(monkeypatch, tmp_path):
  from loops.finders import trial
  from tests.conftest import load_config
  started = []
  start = trial.start
  monkeypatch.setattr(trial, "start", lambda *args: started.append(start(*args)) or started[-1])
  config = load_config("tasks", "gan")  # the generator ("model") and the discriminator at d_learning_rate
  config.task.kwargs = {"d_learning_rate": 4e-3}
  config.find.lr_steps, config.find.lr_min, config.find.lr_max = 10, 1e-5, 1e-2
  result = finders.find("lr", config, str(tmp_path))
  assert result["steps"] >= 2
  parts, _ = started[0]
  ratio = parts.learning_rates["discriminator"] / parts.learning_rates["model"]
  assert ratio != 1.0
  for name, expected in (("model", 1.0), ("discriminator", ratio)):
    optimizer = parts.optimizers[name]
    ramp = optimizer._learning_rate  # pylint: disable=protected-access  (Keras keeps the schedule object there)
    assert isinstance(ramp, lr_range.ExponentialRamp), (name, ramp)
    assert (ramp.lr_min, ramp.lr_max) == pytest.approx((1e-5 * expected, 1e-2 * expected)), name
    assert int(optimizer.iterations.numpy()) == result["steps"], name  # both stepped up the ramp
