"""A user's input function (data/user_stream.py, `data.name=package.module:function` with a `context`): any
pipeline and replica split sees the same global batches, resume continues the stream exactly, eval is padded like
any split, and the mistakes a user makes are one line each. (The example tasks gan and contrastive train on
examples.tasks.digits:batches in tests/test_tasks.py: trained, replica-checked, resumed after SIGTERM.)"""

import numpy as np
import pytest
import tensorflow as tf

from configs import base
from data import pipeline
from data import sources
from errors import ConfigError

GLOBAL_BATCH = 64


def data_config(name):
  config = base.get_config().data
  config.name = name
  return config


@pytest.fixture(scope="module")
def digits():
  config = data_config("examples.tasks.digits:batches")
  return sources.load(config), config


def global_batches(source, config, *, pipelines, local_replicas, start_step=0, steps=30):
  """Each step's global batch (every pipeline's batch of every local replica), rows sorted: a set of examples."""
  per_replica = GLOBAL_BATCH // (pipelines * local_replicas)
  steps_per_epoch = pipeline.steps_per_epoch(source, config, GLOBAL_BATCH)
  streams = [iter(pipeline.train_dataset(source, config, batch_size=per_replica, steps_per_epoch=steps_per_epoch,
                                         seed=3, start_step=start_step, num_shards=pipelines, shard_index=index,
                                         local_replicas=local_replicas)) for index in range(pipelines)]
  batches = []
  for _ in range(steps):
    parts = [next(stream) for stream in streams for _ in range(local_replicas)]
    assert all(len(images) == per_replica for images, _ in parts)
    rows = np.concatenate([images.numpy().reshape(per_replica, -1) for images, _ in parts])
    batches.append(rows[np.lexsort(rows.T)])
  return batches


def test_the_source_reads_lengths_and_specs_from_the_function(digits):
  source, config = digits
  assert (source.train_size, source.eval_size) == (1437, 360)
  assert pipeline.steps_per_epoch(source, config, GLOBAL_BATCH) == 1437 // GLOBAL_BATCH
  images, labels = source.train.element_spec
  assert (images.shape, images.dtype, labels.dtype) == ((8, 8, 1), tf.float32, tf.int64)


def test_any_split_over_pipelines_and_replicas_sees_the_same_global_batches_across_epochs(digits):
  one = global_batches(*digits, pipelines=1, local_replicas=1)  # 30 steps: past the epoch end at 22
  for pipelines, local_replicas in ((2, 1), (1, 2), (2, 2)):
    other = global_batches(*digits, pipelines=pipelines, local_replicas=local_replicas)
    assert all(np.array_equal(a, b) for a, b in zip(one, other)), (pipelines, local_replicas)
  assert not np.array_equal(one[0], one[1])


def test_a_resumed_stream_continues_the_straight_one_mid_epoch(digits):
  straight = global_batches(*digits, pipelines=2, local_replicas=1, steps=30)
  resumed = global_batches(*digits, pipelines=2, local_replicas=1, start_step=17, steps=13)
  assert all(np.array_equal(a, b) for a, b in zip(straight[17:], resumed))


def test_a_shuffle_seeded_on_seed_plus_epoch_the_tensorflow_way_is_taken_and_pairs_over_pipelines():
  """ds.shuffle(n, seed=seed + epoch) under the run's global seed 0 was a ~90-line AutoGraph traceback."""
  tf.random.set_seed(0)  # as a run with seed=0 sets it
  config = data_config("tests.fixtures.input_functions:shuffled_the_tensorflow_way")
  source = sources.load(config)
  one = global_batches(source, config, pipelines=1, local_replicas=1, steps=3)  # one step per epoch
  two = global_batches(source, config, pipelines=2, local_replicas=1, steps=3)
  assert all(np.array_equal(a, b) for a, b in zip(one, two))
  assert not np.array_equal(one[0], one[1])  # each epoch its own order
  assert one[0].shape == (GLOBAL_BATCH, 4) and len(np.unique(one[0][:, 0])) == GLOBAL_BATCH


def test_the_eval_split_is_padded_to_whole_global_batches_with_weight_zero(digits):
  source, config = digits
  batches = list(pipeline.eval_dataset(source, config, batch_size=GLOBAL_BATCH))
  weights = np.concatenate([w.numpy() for _, _, w in batches])
  assert len(weights) == 6 * GLOBAL_BATCH and weights.sum() == 360 and not weights[360:].any()


@pytest.mark.parametrize("name, message", [
    ("unknown_length", "the length of the 'train' dataset is unknown to tf.data; declare it with ds.apply("
                       "tf.data.experimental.assert_cardinality"),
    ("eval_drops_its_tail", "the 'eval' dataset drops its last partial batch"),
    ("eval_length_unknown_when_batched", "the length of the 'eval' dataset at batch_size=128 is unknown to tf.data"),
    ("not_a_dataset", "not_a_dataset('train', ...) must return a tf.data.Dataset of (features, targets) batches, "
                      "got tuple"),
    ("ragged", "the 'train' batches hold ragged or sparse tensors (ds.ragged_batch, tf.sparse): a step takes dense "
               "tensors; batch sequences with ds.padded_batch(batch_size, drop_remainder=True)"),
])
def test_a_wrong_input_function_is_one_line_at_load(name, message):
  with pytest.raises(ConfigError, match=r"^data.name='tests.fixtures.input_functions:" + name + "': .*"):
    try:
      sources.load(data_config(f"tests.fixtures.input_functions:{name}"))
    except ConfigError as e:
      assert message in str(e) and "\n" not in str(e), str(e)
      raise


def test_a_short_train_batch_stops_the_run_naming_the_fix():
  config = data_config("tests.fixtures.input_functions:short_train_batches")
  source = sources.load(config)
  stream = pipeline.train_dataset(source, config, batch_size=8, steps_per_epoch=12, seed=0)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"a train batch is not batch_size long \(use batch"):
    next(iter(stream))


def test_an_epoch_shorter_than_the_first_stops_the_stream_with_one_line_not_a_hang():
  """Every later epoch empty: the stream used to skip to the next epoch forever (~92 % CPU, deaf to SIGTERM)."""
  from data import user_stream
  config = data_config("tests.fixtures.input_functions:empty_after_the_first_epoch")
  source = sources.load(config)
  stream = iter(pipeline.train_dataset(source, config, batch_size=10, steps_per_epoch=10, seed=0))
  assert len([next(stream) for _ in range(10)]) == 10  # epoch 0 whole
  with pytest.raises(tf.errors.FailedPreconditionError) as raised:
    next(stream)
  error = user_stream.short_epoch(raised.value, config.name, step=10, steps_per_epoch=10)
  assert str(error) == ("data.name='tests.fixtures.input_functions:empty_after_the_first_epoch': an epoch of the "
                        "input function ended after 0 of its 10 batches (in the train call from step 10, epoch 1): "
                        "every epoch must yield as many whole batches as the first, whose length the plan read at "
                        "load")
  assert user_stream.short_epoch(tf.errors.FailedPreconditionError(None, None, "other"), config.name, 0, 1) is None


@pytest.mark.e2e
def test_the_built_in_classifier_trains_on_the_shipped_input_function_and_serves_its_features(tmp_path):
  """What a user types: the digits classifier fed by examples.tasks.digits:batches. The number of classes is asked
  for in one line before anything is written; given, it trains, evaluates and exports a SavedModel that serves the
  function's features as they come (float32 pixels 0..16)."""
  import json
  import sys

  from tests.conftest import run_command

  command = [sys.executable, "main.py", "--config=configs/digits_cnn.py",
             "--config.data.name=examples.tasks.digits:batches", "--config.train.steps=60",
             "--config.summary.progress_bar=off", f"--workdir={tmp_path}/run"]
  refused = run_command(command)
  assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
      "error: the model model.name='digits_cnn' needs the number of classes, which "
      "data.name='examples.tasks.digits:batches' does not say (its targets are not integer class ids [examples], or "
      "it is an input function): set --config.data.num_classes=N"), refused.stderr[-2000:]
  assert not (tmp_path / "run").exists()
  trained = run_command(command + ["--config.data.num_classes=10"])
  assert trained.returncode == 0, trained.stderr[-3000:]
  summary = json.load(open(tmp_path / "run" / "summary.json"))
  assert summary["eval/accuracy"] > 0.8, summary
  images, _ = sources.load(data_config("examples.tasks.digits:batches")).eval.batch(16).take(1).get_single_element()
  served = tf.saved_model.load(summary["export"]["saved_model"]).signatures["serving_default"](images=images)
  assert served["probabilities"].shape == (16, 10)
  np.testing.assert_allclose(np.sum(served["probabilities"], 1), 1.0, rtol=1e-5)
