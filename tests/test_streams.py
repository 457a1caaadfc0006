"""Several named input streams in one step (Task.streams, data/user_stream.py): each stream's global batches are
the same on any pipeline and replica split and resume exactly mid-epoch at their own epoch length; the eval reads
the eval stream only; the FixMatch example (examples/tasks/fixmatch.py) trains past its labeled-only baseline,
passes the replica check and resumes bit-identically after SIGTERM; the mistakes are one line each."""

import re
import sys

import numpy as np
import pytest

from configs import base
from data import pipeline
from data import sources
from errors import ConfigError
from examples.tasks import fixmatch
from loops import rules
from loops import replica_check
from loops import run
from tests.conftest import REPO, load_config

GLOBAL_BATCH = 16
STREAMS = {"labeled": 1, "unlabeled": 4}


@pytest.fixture(scope="module")
def fixmatch_source():
  config = base.get_config().data
  config.name = "examples.tasks.fixmatch:streams"
  return sources.load(config, STREAMS, "labeled"), config


def global_batches(source, config, *, pipelines, local_replicas, start_step=0, steps=14):
  """{stream: each step's global batch (every pipeline's rows of every local replica), rows sorted}."""
  per_replica = GLOBAL_BATCH // (pipelines * local_replicas)
  inputs = [iter(pipeline.train_dataset(source, config, batch_size=per_replica, steps_per_epoch=100 // GLOBAL_BATCH,
                                        seed=5, start_step=start_step, num_shards=pipelines, shard_index=index,
                                        local_replicas=local_replicas)) for index in range(pipelines)]
  batches = {name: [] for name in STREAMS}
  for _ in range(steps):
    parts = [next(one) for one in inputs for _ in range(local_replicas)]
    for name, k in STREAMS.items():
      assert all(len(features[name]) == per_replica * k for features, _ in parts)
      rows = np.concatenate([features[name].numpy().reshape(per_replica * k, -1) for features, _ in parts])
      batches[name].append(rows[np.lexsort(rows.T)])
  return batches


def test_each_stream_has_its_own_length_and_the_eval_split_is_the_eval_streams(fixmatch_source):
  source, _ = fixmatch_source
  assert [(s.name, s.multiple, s.size) for s in source.streams] == [("labeled", 1, 100), ("unlabeled", 4, 1337)]
  assert (source.train_size, source.eval_size) == (100, 360)
  features, targets = next(iter(pipeline.train_dataset(source, fixmatch_source[1], batch_size=8,
                                                        steps_per_epoch=12, seed=0)))
  assert features["labeled"].shape == (8, 8, 8, 1) and features["unlabeled"].shape == (32, 8, 8, 1)
  assert set(targets["labeled"].numpy()) <= set(range(10)) and set(targets["unlabeled"].numpy()) == {-1}


def test_any_split_over_pipelines_and_replicas_sees_each_streams_global_batches(fixmatch_source):
  one = global_batches(*fixmatch_source, pipelines=1, local_replicas=1)  # 14 steps: past 2 labeled epochs (6)
  for pipelines, local_replicas in ((2, 1), (1, 2), (2, 2)):
    other = global_batches(*fixmatch_source, pipelines=pipelines, local_replicas=local_replicas)
    for name in STREAMS:
      assert all(np.array_equal(a, b) for a, b in zip(one[name], other[name])), (name, pipelines, local_replicas)
  # the labeled stream's epoch is 6 steps (100 // 16), the unlabeled one's 20 (1337 // 64): each on its own
  distinct = lambda batches: len({row.tobytes() for batch in batches for row in batch})
  assert distinct(one["labeled"][:6]) == distinct(one["labeled"][6:12]) == 96  # each example once per epoch
  assert not all(np.array_equal(a, b) for a, b in zip(one["labeled"][:6], one["labeled"][6:12]))  # reshuffled
  assert distinct(one["unlabeled"]) == 14 * 64  # still in its first epoch


def test_a_resumed_run_continues_every_stream_mid_epoch(fixmatch_source):
  straight = global_batches(*fixmatch_source, pipelines=2, local_replicas=1, steps=14)
  resumed = global_batches(*fixmatch_source, pipelines=2, local_replicas=1, start_step=9, steps=5)  # mid both
  for name in STREAMS:
    assert all(np.array_equal(a, b) for a, b in zip(straight[name][9:], resumed[name])), name


@pytest.mark.e2e
def test_fixmatch_trains_past_its_labeled_only_baseline(tmp_path):
  """Measured (600 steps, seeds 0-2): eval/accuracy 0.942, 0.944, 0.936 and eval/loss 0.25-0.28; on the 100
  labels alone (unlabeled_weight=0) 0.931, 0.931, 0.936 and eval/loss 0.41-0.45."""
  config = load_config("tasks", "fixmatch")
  config.export = False
  summary = run.train_and_evaluate(config, str(tmp_path))
  assert summary["eval/accuracy"] >= 0.935 and summary["eval/loss"] <= 0.33, summary
  assert summary["train/mask_rate"] > 0.5, summary  # most unlabeled rows carry a pseudo-label by the end


# `main.py --check=replicas` passing fixmatch with every pseudo-label taken: a row of tests/test_replica_matrix.py
# (COMMAND_LINE), run there as here once.


@pytest.mark.e2e
def test_the_replica_check_fails_noise_on_a_stream_that_is_not_keyed_per_example():
  config = load_config("tasks", "fixmatch")
  config.task.name = "tests.fixtures.stream_tasks:UnkeyedStrongNoise"
  config.task.kwargs.threshold = 0.0
  lines = []
  assert not replica_check.run(config, out=lines.append), "\n".join(lines)
  assert lines[-1].startswith("replicas: FAIL: ")
  # located: the model's inputs differ before any of its layers (Keras numbers paths per process: _N)
  assert re.search(r": cause: the inputs of digits_cnn(_\d+)? differ at step 1, before any of its layers: the step "
                   r"changes the batch before the model", lines[-1]), lines[-1]


@pytest.mark.e2e
def test_fixmatch_split_by_sigterm_mid_epoch_ends_bit_identical_to_a_straight_run(tmp_path):
  from tests.test_reliability import split_by_sigterm_matches_straight
  args = [sys.executable, "main.py", "--config=configs/tasks.py:fixmatch", "--config.deterministic=True",
          "--config.train.steps=150", "--config.train.steps_per_loop=29", "--config.eval.every_steps=0",
          "--config.checkpoint.every_steps=50", "--config.checkpoint.best_metric=", "--config.export=False",
          "--config.summary.progress_bar=off"]
  # the signal lands in the first call (it traces for seconds), which ends at step 29: mid-epoch of the labeled
  # stream (3 steps an epoch) and of the unlabeled one (10)
  _, resumed = split_by_sigterm_matches_straight(args, tmp_path, wait_for=r"train input: host pipeline")
  restored = int(re.search(r"restored .*ckpt-(\d+)", resumed).group(1))
  assert restored % 3 and restored % 10, restored


@pytest.mark.parametrize("task, message", [
    ("MainStreamScaled", r"^MainStreamScaled.streams: the first stream \('unlabeled'\) is the main one, its batch "
                         r"the run's global batch: its k must be 1, got 4"),
    ("UnknownEvalStream", r"^UnknownEvalStream.eval_stream='test' is not one of its streams \['labeled', "
                          r"'unlabeled'\]$"),
])
def test_a_wrong_streams_declaration_is_one_line_before_anything_is_built(task, message):
  config = load_config("tasks", "fixmatch")
  config.task.name = f"tests.fixtures.stream_tasks:{task}"
  with pytest.raises(ConfigError, match=message):
    rules.check(config)


@pytest.mark.parametrize("data_name, message", [
    ("examples.tasks.digits:batches", r"the input function must take a `stream` keyword: batches\(split, \*, "
                                      r"stream, batch_size, context, seed, epoch\)"),
    ("examples.tasks.digits:classification", r"so classification must be an input function"),
    ("digits", r"data.name must be an input function 'package.module:function'"),
])
def test_a_source_that_cannot_give_streams_is_one_line(data_name, message):
  config = base.get_config().data
  config.name = data_name
  with pytest.raises(ConfigError, match=message):
    sources.load(config, STREAMS, None)


def test_streams_set_on_the_instance_are_one_line(tmp_path):
  config = load_config("tasks", "fixmatch")
  config.task.name = "tests.fixtures.stream_tasks:StreamsFromKwargs"
  with pytest.raises(ConfigError, match=r"^StreamsFromKwargs sets streams or eval_stream on the instance; set them "
                                        r"on the class"):
    run.train_and_evaluate(config, str(tmp_path))


def test_a_loss_for_a_stream_the_task_does_not_read_is_one_line(tmp_path):
  config = load_config("tasks", "fixmatch")
  config.task.name = "tests.fixtures.stream_tasks:LossOfAnUnknownStream"
  config.train.steps = 2
  with pytest.raises(ConfigError, match=r"LossOfAnUnknownStream.per_example_loss .* returned a dict with keys "
                                        r"\['labeled', 'unlabelled'\]; a dict maps the task's streams"):
    run.train_and_evaluate(config, str(tmp_path))


def test_ctx_average_divides_by_the_named_streams_global_batch():
  from loops.task import StepContext
  ctx = StepContext(8, 0, training=True, streams=STREAMS)
  values = np.ones([6], np.float32)
  assert float(ctx.average(values)) == pytest.approx(6 / 8)
  assert float(ctx.average(values, stream="unlabeled")) == pytest.approx(6 / 32)
  with pytest.raises(ConfigError, match=r"stream 'unlabelled' is not one of the task's streams"):
    ctx.average(values, stream="unlabelled")
  assert fixmatch.FixMatch.streams == STREAMS
