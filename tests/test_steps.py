"""loops/distribute/steps.py CallReadOut: a train call's loss and metric sums in one all-reduce equal Keras' own reads."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from loops.distribute import execution
from loops.distribute import steps


def _mirrored():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # conftest's 2 logical CPUs
  assert strategy.num_replicas_in_sync == 2
  return strategy


def test_read_out_equals_keras_metric_results_and_the_reduced_loss():
  strategy = _mirrored()
  with strategy.scope():
    metrics = {"loss": keras.metrics.Mean(), "accuracy": keras.metrics.SparseCategoricalAccuracy()}
  read_out = steps.CallReadOut(strategy, metrics)
  assert read_out.per_replica  # each replica sums into its own copy; the read-out adds them in one all-reduce
  rng = np.random.default_rng(0)
  calls = [(rng.normal(size=(3, 8)).astype(np.float32), rng.normal(size=(3, 8, 4)).astype(np.float32),
            rng.integers(0, 4, size=(3, 8))) for _ in range(2)]

  def replica_step(per_example, logits, labels):
    metrics["loss"].update_state(per_example)
    metrics["accuracy"].update_state(labels, logits)
    return tf.reduce_sum(per_example) / 16.0  # this replica's share of a global batch of 16

  @tf.function
  def call(per_example, logits, labels):
    read_out.start()
    result = read_out.initial()
    for i in tf.range(3):
      replica_values = lambda ctx: tuple(v[i][ctx.replica_id_in_sync_group * 4:][:4]
                                         for v in (per_example, logits, labels))
      per_replica = strategy.experimental_distribute_values_from_function(replica_values)
      per_replica_loss = strategy.run(replica_step, args=per_replica)
      if i == 2:
        result = read_out.reduced(per_replica_loss)
    return result

  for per_example, logits, labels in calls:  # the second call's sums must not carry the first's
    loss, results = read_out.results(call(tf.constant(per_example), tf.constant(logits), tf.constant(labels)))
    assert loss == pytest.approx(per_example[2].sum() / 16.0, rel=1e-6)
    assert results["loss"] == pytest.approx(float(metrics["loss"].result()), rel=1e-6)
    assert results["loss"] == pytest.approx(per_example.mean(), rel=1e-6)
    expected_accuracy = (logits.argmax(-1) == labels).mean()
    assert results["accuracy"] == pytest.approx(float(metrics["accuracy"].result()), abs=1e-7)
    assert results["accuracy"] == pytest.approx(expected_accuracy, abs=1e-7)


def test_without_metrics_the_read_out_is_the_global_loss():
  strategy = _mirrored()
  read_out = steps.CallReadOut(strategy)

  @tf.function
  def call():
    return read_out.reduced(strategy.run(lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                                                 tf.float32) + 1.0))

  assert read_out.initial().shape == [] and float(call()) == 3.0


def test_a_metric_that_is_not_a_mean_is_refused():
  strategy = _mirrored()
  with strategy.scope():
    auc = keras.metrics.AUC()
  with pytest.raises(TypeError, match="train metric 'auc' must be a keras.metrics.Mean"):
    steps.CallReadOut(strategy, {"auc": auc})


@pytest.mark.parametrize("make_strategy", [
    lambda: tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"]),
    lambda: tf.distribute.OneDeviceStrategy("/cpu:0")], ids=["central_storage", "one_device"])
def test_a_single_copy_of_the_sums_is_read_as_it_is(make_strategy):
  """Central storage and one device keep one copy of a metric's variables (created where the framework creates
  them), already summed over replicas; two different updates per call, as steps of a call make."""
  strategy = make_strategy()
  with execution.metrics_scope(strategy):
    metrics = {"loss": keras.metrics.Mean()}
  read_out = steps.CallReadOut(strategy, metrics)
  assert not read_out.per_replica

  def replica_step(values):
    metrics["loss"].update_state(values)
    return tf.reduce_sum(values) / 8.0

  @tf.function
  def call(values):
    read_out.start()
    strategy.run(replica_step, args=(values,))
    return read_out.reduced(strategy.run(replica_step, args=(2.0 * values,)))

  for values in ([1.0, 2.0, 3.0, 4.0], [5.0, 7.0, 9.0, 11.0]):  # the second call must not carry the first's sums
    loss, results = read_out.results(call(tf.constant(values)))
    replicas = strategy.num_replicas_in_sync  # every replica saw the same 4 values, then twice them
    assert loss == pytest.approx(replicas * 2.0 * sum(values) / 8.0)
    assert results["loss"] == pytest.approx(1.5 * np.mean(values), rel=1e-6)
    assert results["loss"] == pytest.approx(float(metrics["loss"].result()), rel=1e-6)
