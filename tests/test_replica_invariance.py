"""Where Keras breaks "N replicas compute what one computes" underneath, the framework mends it: clipping after the
cross-replica sum (loops/modeling/optimizers.py), random layers keyed per example (loops/modeling/random_layers.py);
and where it cannot, the replica check names the cause (loops/replica_check.py)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from loops import first_difference
from loops import replica_check
from loops import rounding
from loops.distribute import strategy as strategy_lib
from loops.modeling import optimizers
from loops.modeling import random_layers
from loops.task.context import StepContext
from tests.conftest import load_config, run_main, set_keys

TWO = ["/cpu:0", "/cpu:1"]


def applied_update(clip, move_clipping, gradients_by_replica):
  """The update one SGD step (lr 0.1) makes on 2 replicas when replica r's gradient is gradients_by_replica[r]."""
  strategy = strategy_lib.mirrored(TWO)
  with strategy.scope():
    variable = tf.Variable(tf.zeros([2]))
    optimizer = keras.optimizers.SGD(learning_rate=0.1, **clip)
    if move_clipping:
      optimizers.take_over_the_sum(optimizer)
    optimizer.build([variable])
  table = tf.constant(gradients_by_replica, tf.float32)

  @tf.function
  def step():
    def apply():
      gradient = table[tf.distribute.get_replica_context().replica_id_in_sync_group]
      optimizer.apply_gradients([(gradient, variable)])
    strategy.run(apply)

  step()
  return -variable.numpy()


@pytest.mark.parametrize("clip, gradients, summed_then_clipped", [
    ({"global_clipnorm": 0.01}, [[1.0, 0.0], [0.0, 1.0]], [0.1 * 0.01 / np.sqrt(2)] * 2),
    ({"clipnorm": 0.01}, [[1.0, 0.0], [0.0, 1.0]], [0.1 * 0.01 / np.sqrt(2)] * 2),
    ({"clipvalue": 0.01}, [[0.008, 0.0], [0.008, 0.0]], [0.1 * 0.01, 0.0]),
])
def test_clipping_applies_to_the_gradient_summed_over_replicas(clip, gradients, summed_then_clipped):
  """Keras clips each replica's partial gradient (the sum then exceeds the clip); moved, the sum is clipped."""
  np.testing.assert_allclose(applied_update(clip, True, gradients), summed_then_clipped, rtol=1e-5)
  keras_own = applied_update(clip, False, gradients)
  assert not np.allclose(keras_own, summed_then_clipped, rtol=1e-2), keras_own  # what it mends


def test_variables_of_several_dtypes_are_summed_over_replicas_each_dtype_apart():
  """TensorFlow's all-reduce packs the gradients into one tensor (ConcatV2 of float64 and float32 fails): the
  framework sums each dtype apart, and the update is the sum's (replica r's gradient r + 1: 1 + 2 = 3, lr 0.1)."""
  strategy = strategy_lib.mirrored(TWO)
  with strategy.scope():
    variables = [tf.Variable(tf.zeros([2], tf.float32)), tf.Variable(tf.zeros([3], tf.float64)),
                 tf.Variable(tf.zeros([1], tf.float32))]
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    optimizers.take_over_the_sum(optimizer)
    optimizer.build(variables)

  @tf.function
  def step():
    def apply():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group + 1
      optimizer.apply_gradients([(tf.cast(r, v.dtype) * tf.ones_like(v), v) for v in variables])
    strategy.run(apply)

  step()
  for variable in variables:
    np.testing.assert_allclose(variable.numpy(), -0.3, rtol=1e-6)


def one_sgd_step(replicas):
  """{key: (initial, final, path)} after one SGD step (lr 0.1, no momentum) with global_clipnorm=0.01."""
  config = set_keys(load_config("digits_cnn"), {
      "optimizer.momentum": 0.0, "optimizer.learning_rate": 0.1, "optimizer.global_clipnorm": 0.01,
      "train.global_batch_size": 32})
  return replica_check.trained_values(replica_check.variant(config, replicas, 1), 1)


def test_a_clipped_run_on_two_replicas_makes_one_devices_clipped_update():
  """The update's global norm is lr x clip on one device and on two, and the updates are the same."""
  one, two = one_sgd_step(1), one_sgd_step(2)
  updates = lambda values: [final - initial for key, (initial, final, _) in values.items() if key[0] == "model model"]
  for values in (one, two):
    assert np.sqrt(sum(np.sum(np.square(u)) for u in updates(values))) == pytest.approx(0.1 * 0.01, rel=1e-4)
  # Measured on an AVX2 CPU: updates ~2e-7 (median), 2 replicas' other summation order 2e-9 apart at most,
  # Keras clipping each replica's part 1e-4 apart.
  for a, b in zip(updates(one), updates(two)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-8)


@pytest.mark.e2e
def test_the_clipping_command_of_the_issue_passes_the_check():
  result = run_main("--config=configs/digits_cnn.py", "--config.optimizer.global_clipnorm=0.01", "--check=replicas")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  assert result.stdout.strip().splitlines()[-1].startswith("replicas: PASS: 1 and 2 replicas agree on all 17 ")


LAYERS = {
    "Dropout": lambda: keras.layers.Dropout(0.5),
    "SpatialDropout1D": lambda: keras.layers.SpatialDropout1D(0.5),
    "GaussianNoise": lambda: keras.layers.GaussianNoise(1.0),
    "GaussianDropout": lambda: keras.layers.GaussianDropout(0.5),
    "AlphaDropout": lambda: keras.layers.AlphaDropout(0.5),
}
ROWS, WIDTH = 8, 6


def noise_by_step(strategy, layer, calls=1, steps=3):
  """[step][call] -> the layer's output on ones [ROWS, 2, WIDTH] in a framework step (keyed), all replicas' rows."""
  with strategy.scope():
    model = keras.Sequential([keras.Input((2, WIDTH)), layer()])
    assert random_layers.key(model, "model", seed=0) == [model.layers[0].path]
    step = tf.Variable(0, dtype=tf.int64)
  batches = iter(strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensors(tf.ones([ROWS, 2, WIDTH])).repeat()))

  @tf.function
  def call(batch):
    def replica(batch):
      with random_layers.keyed(StepContext(ROWS, step, training=True)):
        return [model(batch, training=True) for _ in range(calls)]
    return strategy.run(replica, args=(batch,))

  outputs = []
  for _ in range(steps):
    per_call = call(next(batches))
    outputs.append([np.concatenate([t.numpy() for t in strategy.experimental_local_results(c)]) for c in per_call])
    step.assign_add(1)
  return outputs


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_keyed_random_layers_draw_on_two_replicas_what_one_device_draws(name):
  one = noise_by_step(tf.distribute.OneDeviceStrategy("/cpu:0"), LAYERS[name])
  two = noise_by_step(strategy_lib.mirrored(TWO), LAYERS[name])
  for step_one, step_two in zip(one, two):
    np.testing.assert_allclose(step_two[0], step_one[0], rtol=1e-6)
    first_half, second_half = step_two[0][:ROWS // 2], step_two[0][ROWS // 2:]
    assert not np.allclose(first_half, second_half)  # Keras' own: replica 1 draws replica 0's mask
  assert not np.allclose(one[0][0], one[1][0])  # another step, other draws


def test_a_second_call_in_the_same_step_draws_anew_and_outside_a_step_keras_draws():
  """R-Drop-style double calls get two masks; a user's own eager call keeps Keras' behaviour."""
  outputs = noise_by_step(tf.distribute.OneDeviceStrategy("/cpu:0"), LAYERS["Dropout"], calls=2, steps=1)[0]
  assert not np.array_equal(outputs[0], outputs[1])
  model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dropout(0.5)])
  random_layers.key(model, "model", seed=0)
  dropped = model(tf.ones([64, WIDTH]), training=True).numpy()
  assert 0.2 < np.mean(dropped == 0) < 0.8 and np.all(model(tf.ones([2, WIDTH]), training=False).numpy() == 1)


def test_layers_that_cannot_be_keyed_are_named():
  model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.RandomFlip("horizontal"),
                            keras.layers.Flatten(), keras.layers.Dropout(0.1)])
  random_layers.key(model, "model", seed=0)
  assert [layer.path for layer in random_layers.unkeyed(model)] == [model.layers[0].path]


TASKS = "tests.fixtures.split_sensitive_tasks:"


@pytest.mark.e2e
@pytest.mark.parametrize("task, overrides, cause, where", [
    ("TwoInputsWithBatchNorm", {}, r"cause: BatchNormalization with each replica's own batch statistics "
                                   r"\(batch_normalization(_\d+)?\) \(confirmed: synchronized, the two agree through "
                                   r"step 1\)",
     r"; the sides part first at batch_normalization(_\d+)? at step 1: BatchNormalization normalizing with each "
     r"replica's own batch statistics \(a difference by design, not a bug\)$"),
    ("WithUnkeyedNoise", {"model.sync_batchnorm": True},
     r"cause: random layers drawing the same values on every replica \(Keras' seed state\) "
     r"\(random_translation(_\d+)?\) \(confirmed: in inference mode, the two agree through step 1\)",
     r"; the sides part first at random_translation(_\d+)? at step 1: it draws random values that are not keyed per "
     r"example"),
    # keras.io's VAE Sampling layer: keras.random.normal in a user's layer; under gradient accumulation (each layer
    # then called once per micro-batch: its rows located once per micro-batch)
    ("WithUnkeyedSampling", {"train.grad_accum_steps": 2},
     r"cause: the sides part first at encoder(_\d+)?/sampling(_\d+)? at step 1: it draws random values that are not "
     r"keyed per example", ""),
    ("ClipsInTheStep", {}, r"likely cause: the step clips gradients before the cross-replica sum "
                           r"\(while/clip_by_global_norm\); fix: clip with optimizer.global_clipnorm",
     r"; every layer's output and the loss agree at step 1; the gradients differ: the step changes them before the "
     r"cross-replica sum"),
])
def test_a_fail_names_its_cause_and_where_the_sides_part(task, overrides, cause, where):
  """Keras numbers layer paths per process: _N after the builds of earlier tests."""
  config = set_keys(load_config("tasks", "regression"), {"task.name": TASKS + task, **overrides})
  lines = []
  assert not replica_check.run(config, out=lines.append)
  verdict = lines[-1]
  assert verdict.startswith("replicas: FAIL: "), verdict
  assert " variables differ on 2 replicas from step 1 (rounding explains up to " in verdict, verdict
  # the sides differ at every step; the check stops at the first (its verdict and cause are settled there)
  assert lines[1].startswith("step 1 of 3 (the check stops at the first step that differs) from the same weights; "
                             ), lines[1]
  rows = [re.match(r"  step (\d+) +\d", line) for line in lines]
  assert {row[1] for row in rows if row} == {"1"}, "\n".join(lines)
  assert re.search(cause, verdict) and re.search(where, verdict), verdict
  assert replica_check.REDUCTION not in verdict, verdict


def test_a_suspect_found_where_the_sides_part_is_confirmed_by_turning_it_off_and_else_not_called_the_cause():
  Finding = first_difference.Finding
  suspects = replica_check.Suspects(batchnorm=("bn",), random=("flip",), clipping=("while/clip_by_global_norm",))
  bn = Finding("batchnorm", "model/bn")
  confirmed = replica_check.named_cause(bn, "WHERE", suspects, lambda kind: kind == "batchnorm", 2)
  assert confirmed.startswith("cause: BatchNormalization with each replica's own batch statistics (bn) (confirmed: "
                              "synchronized, the two agree through step 2); fix: --config.model.sync_batchnorm=True"), (
                                  confirmed)
  assert confirmed.endswith("; WHERE")
  assert replica_check.named_cause(bn, "WHERE", suspects, lambda kind: False, 2) == (
      "cause: WHERE (BatchNormalization with each replica's own batch statistics (bn) synchronized: the sides still "
      "differ beyond rounding, so not the only cause)")
  gradients = replica_check.named_cause(Finding("gradients", ""), "WHERE", suspects, None, 2)
  assert gradients.startswith("likely cause: the step clips gradients before the cross-replica sum "
                              "(while/clip_by_global_norm); fix: ") and gradients.endswith("; WHERE")
  assert replica_check.named_cause(Finding("loss", "x"), "WHERE", suspects, None, 2) == "cause: WHERE"
  assert replica_check.named_cause(Finding("random", "m/sampling"), "WHERE", replica_check.Suspects(), None, 2) == (
      "cause: WHERE")  # a user's layer drawing tf.random: not a Keras seed-state suspect, named where it is
  # without reruns (--check=workers) the suspects are named as likely
  assert replica_check.diagnose(suspects).startswith("likely cause: the step clips gradients")
  assert replica_check.diagnose(replica_check.Suspects(batchnorm=("bn",))).startswith(
      "likely cause: BatchNormalization with each replica's own batch statistics (bn)")
  assert replica_check.diagnose(replica_check.Suspects()) == replica_check.REDUCTION


@pytest.mark.e2e
def test_a_fail_from_nan_on_one_side_names_it_not_the_users_reduction():
  config = set_keys(load_config("digits_cnn"), {"train.global_batch_size": 32,
                                                "loss.name": "tests.fixtures.split_sensitive_tasks:"
                                                             "nan_on_the_last_of_several_replicas"})
  lines = []
  assert not replica_check.run(config, out=lines.append)
  verdict = lines[-1]
  assert verdict.startswith("replicas: FAIL: ") and replica_check.REDUCTION not in verdict, verdict
  assert ": cause: the variables hold inf or NaN on 2 replicas where they are finite on 1 replica (" in verdict, verdict


def non_finite_sides(finals_one, finals_two):
  """replica_check.non_finite of variables a, b, ... starting at 0 and ending at these values on each side."""
  one = {(name, 0): (np.zeros(2), np.array(value), name) for name, value in zip("abc", finals_one)}
  two = {(name, 0): (np.zeros(2), np.array(value), name) for name, value in zip("abc", finals_two)}
  return replica_check.non_finite(one, two)


def test_inf_or_nan_is_named_with_its_side_or_both():
  sides = non_finite_sides([[1.0, 2.0], [1.0, np.nan], [np.inf, 0.0]], [[1.0, np.inf], [1.0, np.nan], [1.0, 0.0]])
  assert sides == {"a": "two", "b": "both", "c": "one"}
  assert non_finite_sides([[1.0, 2.0]], [[1.0, 2.5]]) == {}
  assert replica_check.non_finite_cause({}) is None
  assert replica_check.non_finite_cause({"a": "two", "b": "both"}, kind="workers").startswith(
      "cause: the variables hold inf or NaN on 2 workers where they are finite on 1 device (a, b): ")
  assert replica_check.non_finite_cause({"c": "one"}).startswith(
      "cause: the variables hold inf or NaN on 1 replica where they are finite on 2 replicas (c): ")
  both = replica_check.non_finite_cause({name: "both" for name in "abcde"})
  assert both.startswith("cause: both runs' variables hold inf or NaN (a, b, c and 2 more): the step diverges on 1 "
                         "replica too"), both


def test_a_multi_worker_config_is_said_to_be_checked_on_one_process():
  config = set_keys(load_config("digits_cnn"), {"strategy": "multi_worker_mirrored", "train.global_batch_size": 32})
  lines = []
  assert replica_check.run(config, out=lines.append)
  assert lines[0] == ("note: strategy=multi_worker_mirrored: this check runs the same step on one_device and on "
                      "mirrored x2 in this process; --check=workers runs it on 2 worker processes"), lines[0]


@pytest.mark.e2e
def test_transform_gradients_gets_the_sum_and_logs_it_as_one_device_does(tmp_path):
  """The logged norm of the summed gradient is the same on one device and on 2 replicas; a hook that returns
  another structure is one line."""
  from errors import ConfigError
  from loops import run
  norms = []
  for replicas, strategy in ((0, "one_device"), (2, "mirrored")):
    config = set_keys(load_config("tasks", "regression"), {
        "task.name": TASKS + "ClipsAndLogsItsGradients", "strategy": strategy, "cpu_replicas": replicas,
        "train.steps": 2, "train.steps_per_loop": 2, "export": False, "deterministic": True})
    norms.append(run.train_and_evaluate(config, str(tmp_path / strategy))["train/gradient_norm"])
  assert norms[0] > 0.05 and norms[1] == pytest.approx(norms[0], rel=1e-4), norms
  config = set_keys(load_config("tasks", "regression"), {"task.name": TASKS + "ReturnsTooFewGradients"})
  with pytest.raises(ConfigError, match=r"^ReturnsTooFewGradients.transform_gradients \(.*\) must return \{model "
                                        r"name: \[one gradient per trainable variable\]\} for \['model'\]"):
    run.train_and_evaluate(config, str(tmp_path / "few"))


def test_a_check_logs_how_many_steps_are_judged_at_most_every_period(monkeypatch):
  clock, logged = [100.0], []
  monkeypatch.setattr(replica_check.time, "monotonic", lambda: clock[0])
  monkeypatch.setattr(replica_check.logging, "info", lambda text, *args: logged.append(text % args))
  progress = replica_check.StepsJudged(300, seconds=10.0)
  for k, seconds in enumerate([4.0, 4.0, 4.0, 12.0, 1.0]):  # a step's time each
    clock[0] += seconds
    progress.judged(k)
  assert logged == ["check: 3 of 300 steps judged", "check: 4 of 300 steps judged"]


@pytest.mark.e2e
@pytest.mark.parametrize("precision, example, task, verdict", [
    # a conv bias' bfloat16 gradient (a sum over every pixel) differed by 82 % on 2 replicas, blamed on the step
    ("bfloat16", "segmentation", None,
     r"^replicas: PASS: 1 and 2 replicas agree on all 25 variables at each of 3 steps "),
    # a nudge of one bfloat16 rounding moved this model's update by 27 %: the mistake passed within it
    ("bfloat16", "regression", "tests.fixtures.wrong_tasks:LocallyCentred",
     r"^replicas: FAIL: .* from step 1 .*: cause: every layer's output agrees at step 1; the per-example loss "
     r"differs: LocallyCentred.per_example_loss"),
    # a tenth of that: 5.4e-2 apart in bfloat16 where correct code's sides are 4.0e-2 apart; its float32 step shows
    # it (a bfloat16 max-pool tie flip had explained it away there: 1e-2 ties for float32 rows)
    ("bfloat16", "regression", "tests.fixtures.wrong_tasks:PartlyCentred",
     r"^replicas: FAIL: .* from step 1 .*: cause: every layer's output agrees at step 1; the per-example loss "
     r"differs: PartlyCentred.per_example_loss"),
    # float16's nudged floor explained 82 % of this model's update: it passed (its loss scale is not in a float32
    # build: the float32 step takes the rest of the state; steps the loss scale's search skips are not taken there)
    ("float16", "regression", "tests.fixtures.wrong_tasks:PartlyCentred",
     r"^replicas: FAIL: .* from step (\d) .*: cause: every layer's output agrees at step \1; the per-example loss "
     r"differs: PartlyCentred.per_example_loss"),
])
def test_each_step_of_a_half_precision_check_is_judged_in_float32(
    precision, example, task, verdict):
  config = set_keys(load_config("tasks", example), {"mixed_precision": precision, **({"task.name": task} if task else {})})
  lines = []
  replica_check.run(config, out=lines.append)
  assert re.search(verdict, lines[-1]), "\n".join(lines)
  first = "1" if precision == "bfloat16" else r"\d"  # float16's first steps may be its loss scale's search: skipped
  assert re.search(rf"^  steps? {first}\b.*: taken again on both sides in float32 from the same weights, judged as "
                   r"a float32 check judges it", "\n".join(lines), re.M), "\n".join(lines)


def test_a_model_pinning_its_output_to_float32_is_floored_in_float64_and_its_mistake_named():
  """Keras' mixed-precision guide pins the output layer to float32: the float64 build kept it float32, the float32
  output met float64 targets and the floor fell back to a nudge; now the pinned layer is float64 there too."""
  config = set_keys(load_config("tasks", "regression"), {"task.name": "tests.fixtures.wrong_tasks:PinnedOutputCentred"})
  lines = []
  replica_check.run(config, out=lines.append)
  assert "(the one-replica side's own float32 error: its step again in float64; x10)" in "\n".join(lines), "\n".join(lines)
  assert re.search(r"^replicas: FAIL: .* from step 1 .*: cause: every layer's output agrees at step 1; the "
                   r"per-example loss differs: PinnedOutputCentred.per_example_loss", lines[-1]), "\n".join(lines)


@pytest.mark.e2e
@pytest.mark.parametrize("example", ["gan", "fixmatch"])
def test_the_examples_run_the_float64_floor_not_the_nudge(example, monkeypatch):
  """Their float32 draws, constants and logits casts ran the floor's step in float32 beside float64 (an error, so
  the coarser nudge judged); the floor forced at every step (least difference 0) must be float64."""
  monkeypatch.setitem(rounding.MINIMUM, None, 0.0)
  lines = []
  assert replica_check.run(load_config("tasks", example), steps=1, out=lines.append), "\n".join(lines)
  assert "(the one-replica side's own float32 error: its step again in float64; x10)" in "\n".join(lines), "\n".join(lines)


def test_float16_steps_skipped_on_one_side_are_said_and_a_check_of_nothing_else_fails():
  rows = (rounding.Row(2, "model m: kernel", 1e-6, 1e-4),)
  passed, lines = replica_check.report(rounding.Verdict(rows), 3, precision="float16", skipped=(1, 3))
  assert passed and "  steps 1, 3: not compared: float16 overflowed on one side only" in "\n".join(lines)
  passed, lines = replica_check.report(rounding.Verdict(()), 3, precision="float16", skipped=(1, 2, 3))
  assert not passed and lines[-1].startswith("replicas: FAIL: float16 overflowed on one side only at every step")
