"""The task contract's pieces in-process: the step context's cross-replica helpers on 2 replicas, a user's arrays
as a source (nests of any dtype, exact order, eval padding), and the one-line errors of task and data settings."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import data
from errors import ConfigError
from loops import rules
from loops.task import StepContext
from tests.conftest import load_config


def mirrored():
  """2 replicas, with collective keys of their own (loops/distribute/strategy.py: other strategies in this process)."""
  from loops.distribute import strategy as strategy_lib
  return strategy_lib.mirrored(["/cpu:0", "/cpu:1"])


def gathered_loss_gradient(strategy, x):
  """d/dw of the mean over the global batch of (w * x_i - mean_j(w * x_j))^2, computed per replica with
  all_gather, summed over replicas (what the optimizer applies)."""
  with strategy.scope():
    w = tf.Variable(1.5)
  global_batch = int(x.shape[0])

  def replica(local):
    ctx = StepContext(global_batch, tf.constant(0, tf.int64), training=True)
    with tf.GradientTape() as tape:
      every = ctx.all_gather(w * local)
      per_example = tf.square(w * local - tf.reduce_mean(every))
      loss = ctx.average(per_example)
    return tape.gradient(loss, w)

  dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))
  per_replica = strategy.run(tf.function(replica), args=(next(iter(dataset)),))
  return float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))


def test_all_gather_lets_gradients_flow_back_so_2_replicas_give_the_one_replica_gradient():
  x = tf.constant(np.random.default_rng(0).normal(size=[8]).astype(np.float32))
  one = gathered_loss_gradient(tf.distribute.OneDeviceStrategy("/cpu:0"), x)
  two = gathered_loss_gradient(mirrored(), x)
  assert abs(one) > 0.1
  assert two == pytest.approx(one, rel=1e-5)


def masked_gather_gradient(strategy, x):
  """As gathered_loss_gradient, over the rows each replica keeps (x > 0): counts that differ per replica."""
  with strategy.scope():
    w = tf.Variable(1.5)

  def replica(local):
    ctx = StepContext(int(x.shape[0]), tf.constant(0, tf.int64), training=True)
    with tf.GradientTape() as tape:
      kept = ctx.all_gather(tf.boolean_mask(w * local, local > 0))
      loss = ctx.average(tf.square(w * local - tf.reduce_mean(kept))) + 0.0 * tf.cast(tf.shape(kept)[0], tf.float32)
    return tape.gradient(loss, w), tf.shape(kept)[0]

  dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))
  gradients, counts = strategy.run(tf.function(replica), args=(next(iter(dataset)),))
  return (float(strategy.reduce(tf.distribute.ReduceOp.SUM, gradients, axis=None)),
          [int(c) for c in strategy.experimental_local_results(counts)])


def test_all_gather_of_rows_whose_count_differs_per_replica_gives_the_one_replica_rows_and_gradient():
  x = tf.constant([0.5, -1.0, 2.0, 1.5, -0.3, -2.0, -0.7, 0.9])  # 3 kept rows on replica 0, 1 on replica 1
  one, (count,) = masked_gather_gradient(tf.distribute.OneDeviceStrategy("/cpu:0"), x)
  two, counts = masked_gather_gradient(mirrored(), x)
  assert count == 4 and counts == [4, 4]
  assert abs(one) > 0.1 and two == pytest.approx(one, rel=1e-5)


def normal_draws(strategy, input_pipelines=1):
  """[replica's draws] of StepContext.normal for a global batch of 8."""
  def replica():
    ctx = StepContext(8, tf.constant(5, tf.int64), training=True, input_pipelines=input_pipelines)
    return ctx.normal(8 // strategy.num_replicas_in_sync, [3])
  return [v.numpy() for v in strategy.experimental_local_results(strategy.run(tf.function(replica)))]


def test_normal_gives_the_global_batch_the_same_draws_on_1_and_2_replicas():
  one = normal_draws(tf.distribute.OneDeviceStrategy("/cpu:0"))[0]
  np.testing.assert_array_equal(np.concatenate(normal_draws(mirrored())), one)


def test_normal_pairs_each_example_with_its_one_device_draw_when_workers_read_strided_shards():
  one = normal_draws(tf.distribute.OneDeviceStrategy("/cpu:0"))[0]
  worker_0, worker_1 = normal_draws(mirrored(), input_pipelines=2)  # 2 workers of 1 replica each
  rows = np.arange(8)
  shards = [list(tf.data.Dataset.from_tensor_slices(rows).shard(2, w).as_numpy_iterator()) for w in (0, 1)]
  np.testing.assert_array_equal(worker_0, one[shards[0]])  # worker w reads rows w, w + 2, ...
  np.testing.assert_array_equal(worker_1, one[shards[1]])
  assert not np.array_equal(worker_0, one[:4])


def test_normal_gives_each_micro_batch_of_gradient_accumulation_its_own_rows_draws():
  def second_micro_batch():  # rows 1, 3, 5, 7 of the batch (micro-batch i takes rows i, i + k, ...)
    return StepContext(8, tf.constant(5, tf.int64), training=True, micro_batch=(1, 2)).normal(4, [3])
  one = normal_draws(tf.distribute.OneDeviceStrategy("/cpu:0"))[0]
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  np.testing.assert_array_equal(strategy.run(tf.function(second_micro_batch)).numpy(), one[1::2])


def test_log_refuses_an_undeclared_name_and_is_silent_in_eval():
  ctx = StepContext(4, tf.constant(0, tf.int64), training=True, declared=("accuracy",))
  with pytest.raises(ValueError, match=r"ctx.log\('acc', \.\.\.\): declare it in the task's train_metrics "
                                       r"\(declared: \['accuracy'\]\)"):
    ctx.log("acc", 1.0)
  ctx.log("accuracy", tf.constant([1.0, 0.0, 1.0]))
  assert {k: tuple(float(x) for x in v) for k, v in ctx.logged().items()} == {"accuracy": (2.0, 3.0)}
  evaluating = StepContext(4, tf.constant(0, tf.int64), training=False)
  evaluating.log("anything", 1.0)
  assert evaluating.logged() == {}


def config_with(**keys):
  c = load_config("tasks", "regression")
  for key, value in keys.items():
    node = c
    *groups, name = key.split("__")
    for group in groups:
      node = node[group]
    node[name] = value
  return c


@pytest.mark.parametrize("keys, message", [
    ({"task__name": "regression"}, "task.name 'regression' is neither 'classification' nor 'package.module:Name' or 'path/to/file.py:Name'"),
    ({"task__name": "tests.fixtures.contract_tasks:NotATask"}, "is type .*not a subclass of loops.task.Task"),
    ({"task__name": "tests.fixtures.contract_tasks:Empty"}, "defines neither per_example_loss .* nor train_step"),
    ({"task__name": "tests.fixtures.contract_tasks:StepWithoutEval"},
     r"^tests.fixtures.contract_tasks:StepWithoutEval writes its own train_step but no eval_step, and the default "
     r"eval_step reports per_example_loss, which it does not define: write eval_step\(self, batch, models, ctx\) "
     r"returning \{name: per-example values\} \(reported as eval/<name>\)$"),
    ({"task__name": "tests.fixtures.contract_tasks:Stepper", "train__grad_accum_steps": 2},
     "train.grad_accum_steps=2 needs a loss-level task"),
    ({"task__name": "tests.fixtures.contract_tasks:Takes", "task__kwargs": {"depth": 2}},
     r"task.kwargs \{'depth': 2\} do not fit tests.fixtures.contract_tasks:Takes"),
    ({"task__kwargs": {"depth": 2}, "task__name": "classification"}, "task.kwargs .* are for a task of your own"),
])
def test_task_settings_are_refused_in_one_line_before_anything_is_built(keys, message):
  config = config_with(**{k: v for k, v in keys.items() if k != "task__kwargs"})
  if "task__kwargs" in keys:
    config.task.kwargs.update(keys["task__kwargs"])
  with pytest.raises(ConfigError, match=message):
    rules.check(config)


def test_an_eval_step_that_reduces_is_refused_before_training(tmp_path):
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:ScalarEval")
  with pytest.raises(ConfigError, match=r"ScalarEval.eval_step value 'loss' has shape \[\]; expected one value "
                                        r"per example, shape \[2\]"):
    run.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_a_per_example_loss_that_reduces_is_one_line_naming_its_file_before_training(tmp_path):
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:ScalarLoss")
  with pytest.raises(ConfigError, match=r"^loss 'ScalarLoss.per_example_loss \(.*tests/fixtures/contract_tasks.py:\d+\)' "
                                        r"returned shape \[\]; expected one loss per example, shape \[64\]"):
    run.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("strategy, replicas", [("one_device", 0), ("mirrored", 2)])
def test_values_collected_over_the_whole_eval_set_reach_reduce_eval_once_each(strategy, replicas, tmp_path):
  from examples.tasks.regression import digit_values
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:CollectsValues", strategy=strategy,
                       cpu_replicas=replicas, checkpoint__best_metric="eval/value_sum", export=False)
  config.train.steps, config.train.steps_per_loop, config.eval.every_steps = 4, 2, 2
  summary = run.train_and_evaluate(config, str(tmp_path / "w"))
  values = digit_values("eval")[1]  # 360 examples: padded to 384 on the eval's global batches of 64
  assert summary["eval/count"] == len(values) == 360
  assert summary["eval/value_sum"] == pytest.approx(float(values.sum()), rel=1e-6)
  assert summary["best_metric"] == "eval/value_sum"


@pytest.mark.parametrize("name, message", [
    ("CollectsMissing", r"CollectsMissing.eval_collect names \['embedding'\], which eval_step does not return"),
    ("CollectsStrings", r"CollectsStrings.eval_step value 'value' \(eval_collect\) holds strings, which are not "
                        r"gathered across replicas and workers: collect numbers"),
    ("ReducesOtherNames", r"ReducesOtherNames.reduce_eval \(.*\) returned \['total'\]; eval_reduced declares "
                          r"\['count', 'value_sum'\]"),
])
def test_collected_values_and_reduced_names_that_do_not_match_are_one_line(name, message, tmp_path):
  from loops import run
  config = config_with(task__name=f"tests.fixtures.contract_tasks:{name}", export=False)
  config.train.steps, config.train.steps_per_loop, config.eval.every_steps = 2, 2, 2
  with pytest.raises(ConfigError, match=message):
    run.train_and_evaluate(config, str(tmp_path / "w"))


def test_the_built_in_classifier_on_a_users_data_takes_its_class_count_from_the_ids_or_the_config(tmp_path):
  from loops import run
  config = load_config("digits_cnn")
  config.data.name, config.export = "tests.fixtures.contract_tasks:digit_images", False
  report = run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)
  assert report["num_classes"] == 10 and report["parameters"] > 0
  config.data.num_classes = 12
  assert run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)["num_classes"] == 12
  config.data.name = "examples.tasks.regression:digit_values"  # float targets: no class ids to count
  config.data.num_classes = None
  with pytest.raises(ConfigError, match=r"^the model model.name='digits_cnn' needs the number of classes, which "
                                        r"data.name='examples.tasks.regression:digit_values' does not say .*: set "
                                        r"--config.data.num_classes=N$"):
    run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)


@pytest.mark.parametrize("function, message", [
    ("not_a_pair", r"not_a_pair\('train'\) must return \(features, targets\), got ndarray"),
    ("ragged", "needs the examples on its first axis, with the same count; got first axes"),
    ("other_eval", "the eval split's arrays .* differ from the train split's"),
    ("missing", "module 'tests.fixtures.contract_tasks' has no 'missing' \\(data.name="),
])
def test_a_bad_data_function_is_one_line(function, message):
  config = config_with(data__name=f"tests.fixtures.contract_tasks:{function}")
  with pytest.raises(ConfigError, match=message):
    data.load(config.data)


def test_image_settings_on_a_users_arrays_are_refused(tmp_path):
  from loops import run
  config = config_with(data__random_flip=True)
  with pytest.raises(ConfigError, match=r"data.random_flip=True is an image setting; dataset "
                                        r"'examples.tasks.regression:digit_values' is a user's arrays"):
    run.train_and_evaluate(config, str(tmp_path / "w"))


def test_nested_arrays_of_any_dtype_batch_resume_and_pad_exactly():
  config = config_with(data__name="tests.fixtures.contract_tasks:nested")
  source = data.load(config.data)
  features, targets = source.train.element_spec
  assert features["tokens"].dtype == tf.int64 and targets["multi_hot"].shape == (4,)
  straight = data.train_dataset(source, config.data, batch_size=8, steps_per_epoch=8, seed=3)
  batches = [b for _, b in zip(range(12), straight)]
  resumed = data.train_dataset(source, config.data, batch_size=8, steps_per_epoch=8, seed=3, start_step=9)
  for expected, got in zip(batches[9:], resumed):
    tf.nest.map_structure(np.testing.assert_array_equal, expected, got)
  halves = [data.train_dataset(source, config.data, batch_size=4, steps_per_epoch=8, seed=3, num_shards=2,
                               shard_index=i) for i in (0, 1)]
  for expected, (a, b) in zip(batches[:3], zip(*halves)):  # 2 pipelines together read each global batch
    got = tf.nest.map_structure(lambda x, y: np.sort(np.concatenate([x, y]), axis=0), a, b)
    tf.nest.map_structure(lambda e, g: np.testing.assert_array_equal(np.sort(e, axis=0), g), expected, got)
  evaluation = list(data.eval_dataset(source, config.data, batch_size=8))
  weights = np.concatenate([w.numpy() for _, _, w in evaluation])
  assert len(weights) == 24 and weights.sum() == 21 and not weights[21:].any()
  tokens = np.concatenate([f["tokens"].numpy() for f, _, _ in evaluation])
  np.testing.assert_array_equal(tokens[:21], data.load(config.data).eval.batch(21).get_single_element()[0]["tokens"])


def test_all_gather_under_gradient_accumulation_says_it_gathers_micro_batches(caplog):
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  for micro_batch in ((0, 1), (0, 4)):
    ctx = StepContext(8, tf.constant(0, tf.int64), training=True, micro_batch=micro_batch)
    strategy.run(tf.function(lambda: ctx.all_gather(tf.ones([2]))))
  said = [r.getMessage() for r in caplog.records if "ctx.all_gather" in r.getMessage()]
  assert said == ["ctx.all_gather under train.grad_accum_steps=4 gathers each micro-batch: a loss over the gathered "
                  "rows (contrastive negatives) sees 1/4 of the global batch at a time"]


def test_a_step_level_task_under_float16_must_scale_each_loss_it_applies(tmp_path):
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:ForgetsToScale", mixed_precision="float16",
                       export=False)
  config.train.steps, config.train.steps_per_loop, config.eval.every_steps = 2, 2, 0
  with pytest.raises(ConfigError, match=r"^ForgetsToScale.train_step applies optimizers \['model'\] to gradients of "
                                        r"an unscaled loss: under mixed_precision='float16' take gradients of "
                                        r"optimizers\[name\].scale_loss\(loss\)"):
    run.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "checkpoints").exists()  # refused while the first call was traced


def test_float16_optimizers_must_all_scale_and_a_loss_level_task_takes_one():
  from loops.task import rules as task_rules
  from tests.fixtures import contract_tasks
  models = {"model": keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
            "other": keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])}
  scaled = lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
  with pytest.raises(ConfigError, match=r"build_optimizers: \['other'\] would not scale the loss under "
                                        r"mixed_precision='float16'"):
    task_rules.check_optimizers(contract_tasks.Stepper(), models, {"model": scaled(), "other": keras.optimizers.SGD()},
                                 float16=True)
  task_rules.check_optimizers(contract_tasks.Stepper(), models, {"model": scaled(), "other": scaled()}, float16=True)
  with pytest.raises(ConfigError, match=r"scales one loss for one optimizer; Takes has 2 \(\['model', 'other'\]\): "
                                        r"write a train_step that scales each optimizer's loss"):
    task_rules.check_optimizers(contract_tasks.Takes(), models, {"model": scaled(), "other": scaled()}, float16=True)


@pytest.mark.parametrize("arguments, expected", [
    ({"beta_1": 0.0, "epsilon": 1e-3}, {"beta_1": 0.0, "epsilon": 1e-3}),
    ({"learning_rate": 0.5, "beta_2": 0.9}, {"beta_2": 0.9}),
    ({"learning_rat": 5.0}, r"^ctx.optimizer\(learning_rat=...\): neither an optimizer.\* setting \(.*learning_rate.*\) "
                            r"nor an argument of keras.optimizers.Adam \(.*beta_1.*\)$"),
])
def test_ctx_optimizer_passes_keras_arguments_through_and_refuses_unknown_ones(arguments, expected):
  from loops import build as build_lib
  from loops.distribute import cluster
  config = config_with(task__name="tests.fixtures.contract_tasks:OptimizerArguments", optimizer__name="adam")
  config.task.kwargs.update(arguments)
  rules.check(config)
  if isinstance(expected, str):
    with pytest.raises(ConfigError, match=expected):
      build_lib.build(config, cluster.ClusterRole())
    return
  parts = build_lib.build(config, cluster.ClusterRole())
  assert parts.task.kwargs == arguments  # self.kwargs: task.kwargs, as the constructor got them
  optimizer = parts.optimizers["model"]
  for key, value in expected.items():
    assert getattr(optimizer, key) == pytest.approx(value), key


@pytest.mark.e2e
def test_each_optimizer_logs_the_learning_rate_it_applies(tmp_path):
  """A task with two optimizers: train/learning_rate/<name> each, train/learning_rate the model's."""
  from loops import run
  from tests.test_sidecar import event_scalars
  config = load_config("tasks", "gan")
  config.task.kwargs.d_learning_rate = 4e-4
  config.optimizer.schedule, config.optimizer.final_lr_fraction = "cosine", 0.5
  config.train.steps, config.train.steps_per_loop, config.export = 4, 2, False
  run.train_and_evaluate(config, str(tmp_path))
  rate = lambda tag: event_scalars(str(tmp_path), tag)
  assert rate("train/learning_rate") == rate("train/learning_rate/model")
  discriminator, generator = rate("train/learning_rate/discriminator"), rate("train/learning_rate/model")
  assert sorted(discriminator) == [2, 4] and discriminator[2] < 4e-4 and discriminator[4] < discriminator[2]
  for step in (2, 4):  # the same cosine, each from its own base rate
    assert discriminator[step] / generator[step] == pytest.approx(0.4, rel=1e-5)


def test_ctx_normal_in_eval_step_runs_and_a_vector_metric_is_refused_before_training(tmp_path):
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:NoisyEval", export=False)
  config.train.steps, config.train.steps_per_loop = 2, 2
  assert run.train_and_evaluate(config, str(tmp_path / "noisy"))["eval/mae"] > 0
  config = config_with(task__name="tests.fixtures.contract_tasks:VectorMetric")
  with pytest.raises(ConfigError, match=r"^VectorMetric.build_metrics: metric 'f1' \(F1Score\) gives shape "
                                        r"\[10\]; an eval metric is one number"):
    run.train_and_evaluate(config, str(tmp_path / "vector"))
  assert not (tmp_path / "vector" / "checkpoints").exists()


@pytest.mark.parametrize("returns, got", [("none", "None"), ("dict", "a dict"), ("vector", r"shape \[64\]")])
def test_a_train_step_that_returns_no_loss_share_is_one_line_before_training(returns, got, tmp_path):
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:StepReturns")
  config.task.kwargs.returns = returns
  with pytest.raises(ConfigError, match=r"^StepReturns.train_step \(.*contract_tasks.py:\d+\) returned " + got +
                     r"; it must return this replica's share of the global loss, one number"):
    run.train_and_evaluate(config, str(tmp_path))
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("returns, message", [
    ("none", r"returned NoneType; eval_reduced declares \['count', 'value_sum'\]"),
    ("string", r"value 'value_sum' is str \(\), not one number"),
    ("array", r"value 'value_sum' is ndarray \(2,\), not one number"),
    ("raises", r"raised KeyError: 'count'"),
])
def test_a_reduce_eval_that_fails_is_one_line_naming_it(returns, message, tmp_path):
  """Refused at the zero-batch probe before training when its form is wrong; an exception on the real set (the
  probe cannot judge one on zero rows) is one line at the eval."""
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:ReduceEvalReturns",
                       checkpoint__best_metric="eval/count", export=False)
  config.task.kwargs.returns = returns
  config.train.steps, config.train.steps_per_loop, config.eval.every_steps = 2, 2, 2
  with pytest.raises(ConfigError, match=r"^ReduceEvalReturns.reduce_eval \(.*contract_tasks.py:\d+\) " + message):
    run.train_and_evaluate(config, str(tmp_path))
  assert (tmp_path / "checkpoints").exists() == (returns == "raises")


@pytest.mark.parametrize("names, main", [(("critic", "model"), "model"), (("generator", "critic"), "generator"),
                                         ((), None)])
def test_the_main_model_and_optimizer_are_the_ones_named_model_else_the_first(names, main):
  from loops import build as build_lib
  fields = {field.name: None for field in dataclasses.fields(build_lib.Parts)}
  parts = build_lib.Parts(**{**fields, "models": {name: f"{name} net" for name in names},
                             "optimizers": {name: f"{name} opt" for name in names if name != "critic"}})
  assert parts.main_model == (f"{main} net" if main else None)
  assert parts.main_optimizer == (f"{main} opt" if main else None)


def test_an_optimizer_the_task_makes_on_self_is_refused_naming_the_optimizers_argument(tmp_path):
  """Keras-style `self.optimizer = Adam()` was a ~270-line traceback ("Mixing different tf.distribute.Strategy")."""
  from loops import run
  config = config_with(task__name="tests.fixtures.contract_tasks:OwnOptimizer")
  with pytest.raises(ConfigError) as raised:
    run.train_and_evaluate(config, str(tmp_path / "w"))
  assert str(raised.value) == (
      "OwnOptimizer.model_optimizer is an optimizer the task made itself (outside the run's strategy, checkpoints and "
      "learning-rate schedule): make it in build_optimizers (return {model name: ctx.optimizer(...)}) and apply the "
      "one train_step gets in its `optimizers` argument")
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_a_loss_per_output_is_refused_before_the_outputs_are_asked_for_logits():
  from tests.conftest import set_keys
  config = set_keys(load_config("digits_cnn"), {"model.name": "tests.fixtures.keras_fit_models:compiled_two_outputs"})
  rules.check(config)
  from loops import build as build_lib
  from loops.distribute import cluster
  with pytest.raises(ConfigError) as raised:
    build_lib.build(config, cluster.ClusterRole())
  assert str(raised.value).startswith("model 'two_outputs' was compiled with a loss per output; the built-in "
                                      "classification trains one output: port it to a Task")
