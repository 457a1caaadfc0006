"""Sequences of different lengths (issue 42, point 1): an input function of padded batches ([batch, None]) trains,
evaluates on padded eval batches, is traced once whatever the lengths, resumes bit-identically after SIGTERM
mid-epoch; bucketed batches are one device's global batches on any replica count (the replica check of both:
tests/test_replica_matrix.py); the zero-batch probe builds unknown lengths and says whose failure it
is; the throughput counts examples, not images."""

import collections
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from data import pipeline
from data import user_stream
from errors import ConfigError
from examples.tasks import sequence
from loops import run
from loops import task as task_lib
from loops.callbacks import run_summary
from tests.conftest import REPO, load_config

PY = sys.executable
INPUT = "examples.tasks.sequence:padded_batches"
TRACES = collections.Counter()  # graph traces of CountingTraces' methods (eager calls are not counted)


class CountingTraces(sequence.ContainsMarker):
  """The example task, counting how often TensorFlow traces its loss and eval step."""

  def per_example_loss(self, batch, models, ctx):
    if not tf.executing_eagerly():
      TRACES["per_example_loss"] += 1
    return super().per_example_loss(batch, models, ctx)

  def eval_step(self, batch, models, ctx):
    if not tf.executing_eagerly():
      TRACES["eval_step"] += 1
    return super().eval_step(batch, models, ctx)


def widths(batch_size, steps):
  """The padded lengths of the first `steps` train batches of one pipeline (the epochs in turn)."""
  found, epoch = [], 0
  while len(found) < steps:
    ds = sequence.padded_batches("train", batch_size=batch_size, context=tf.distribute.InputContext(),
                                 seed=tf.constant(0, tf.int64), epoch=tf.constant(epoch, tf.int64))
    found += [int(tokens.shape[1]) for tokens, _ in ds]
    epoch += 1
  return found[:steps]


@pytest.mark.e2e
def test_the_example_trains_to_its_stated_accuracy_traced_once_whatever_the_lengths(tmp_path):
  config = load_config("tasks", "sequence")
  config.task.name = "tests.test_sequences:CountingTraces"
  config.train.steps, config.train.steps_per_loop, config.eval.every_steps = 200, 10, 100
  TRACES.clear()
  summary = run.train_and_evaluate(config, str(tmp_path))
  assert summary["eval/accuracy"] >= 0.95, summary  # the docstring says ~1.0; a constant guess scores 0.5
  assert len(set(widths(64, 200))) >= 10  # the 200 steps saw batches of many lengths ...
  assert TRACES == {"per_example_loss": 1, "eval_step": 1}, TRACES  # ... and one trace each (20 calls, 3 evals)


def global_batches(batch_size, pipelines, replicas, steps=6):
  """The first `steps` global batches of bucketed_batches as (tokens, labels): every pipeline's batches of a step
  concatenated in pipeline and replica order."""
  local, per = replicas // pipelines, []
  for pipeline_id in range(pipelines):
    ds = sequence.bucketed_batches("train", batch_size=batch_size, seed=tf.constant(0, tf.int64),
                                   context=tf.distribute.InputContext(pipelines, pipeline_id, replicas),
                                   epoch=tf.constant(1, tf.int64))
    assert int(ds.cardinality()) == sequence.SIZES["train"] // (batch_size * replicas) * local
    per.append([(t.numpy(), l.numpy()) for t, l in ds.take(steps * local)])
  parts = [[per[p][step * local + r] for p in range(pipelines) for r in range(local)] for step in range(steps)]
  return [tuple(np.concatenate([part[i] for part in step]) for i in (0, 1)) for step in parts]


def test_bucketed_batches_are_one_devices_global_batches_on_any_replica_and_worker_count():
  one = global_batches(64, 1, 1)
  for pipelines, replicas in ((1, 2), (2, 2), (2, 4)):
    for (tokens, labels), (want_tokens, want_labels) in zip(global_batches(64 // replicas, pipelines, replicas), one):
      np.testing.assert_array_equal(tokens, want_tokens)
      np.testing.assert_array_equal(labels, want_labels)
  assert len({tokens.shape[1] for tokens, _ in one}) > 1  # each global batch padded to its own longest
  padded = sum(tokens.size for tokens, _ in one) / sum(np.count_nonzero(tokens) for tokens, _ in one)
  assert padded < 1.5, padded  # sorted windows: little padding (padded_batches: ~3.8 tokens per real one)


def test_eval_batches_are_padded_per_replica_and_every_example_counted_once():
  source = user_stream.load(INPUT, sequence.padded_batches)
  assert source.eval.element_spec[0].shape.as_list() == [None]
  tokens, _, labels = (np.asarray(a) for a in sequence.sequences("eval"))
  real = collections.Counter()
  for shard in range(2):  # two workers of one replica each; 512 examples pad to 9 global batches of 60
    ds = pipeline.eval_dataset(source, load_config("tasks", "sequence").data, batch_size=30, num_shards=2,
                               shard_index=shard)
    for features, targets, weights in ds:
      lengths = np.count_nonzero(features.numpy(), axis=1)
      assert features.shape[0] == 30 and features.shape[1] == lengths.max()  # the longest of this batch, no wider
      for row, label, weight in zip(features.numpy(), targets.numpy(), weights.numpy()):
        if weight:
          real[(tuple(row[row != 0]), int(label))] += 1
  expected = collections.Counter()
  splits = sequence.sequences("eval")[1]
  for i in range(len(labels)):
    expected[(tuple(tokens[splits[i]:splits[i + 1]]), int(labels[i]))] += 1
  assert real == expected  # every eval example once, tokens intact


def test_the_zero_batch_probe_builds_unknown_lengths_and_blames_only_what_it_built():
  spec = (tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32))
  tokens, labels = task_lib.zero_batch(spec, 2)
  assert tokens.shape == (2, 1) and labels.shape == (2,)
  with pytest.raises(ConfigError, match=r"could not build a probe batch .*\(not your eval_step\)"):
    task_lib.zero_batch((tf.TensorSpec(None, tf.float32), spec[1]), 2)

  class Failing(sequence.ContainsMarker):
    def eval_step(self, batch, models, ctx):
      raise ValueError("boom")

  with pytest.raises(ConfigError, match=r"Failing.eval_step failed on a zero batch of 2 \(shapes \(\[2, 1\], "
                                        r"\[2\]\)\): ValueError: boom"):
    task_lib.eval_names(Failing(), {}, spec, 4, {})

  class FailingTraced(sequence.ContainsMarker):  # a compiled eval_step: its cause and line, not "in user code:"
    @tf.function
    def eval_step(self, batch, models, ctx):
      raise ValueError("boom in a tf.function")

  with pytest.raises(ConfigError, match=r"FailingTraced.eval_step failed on a zero batch of 2 \(shapes .*\): "
                                        r"ValueError: boom in a tf.function \(in .*tests/test_sequences.py:\d+\)$"):
    task_lib.eval_names(FailingTraced(), {}, spec, 4, {})


def test_progress_and_summary_count_examples_for_sequences_and_images_for_images():
  summary = {"step": 10, "total_steps": 10, "wall_seconds": 2.0, "train_seconds": 1.0, "examples_per_sec": 640.0}
  done = run_summary.short_summary(summary, trained=True, workdir="/runs/x", unit="examples")[0]
  assert done.startswith("done: step=10/10 in 2.0 s (training 1.0 s; after the first call 640 examples/s")
  from loops.core import progress
  assert progress.throughput_unit(user_stream.load(INPUT, sequence.padded_batches)) == "examples"
  from data import sources
  assert progress.throughput_unit(sources.load(load_config("digits_cnn").data)) == "images"


@pytest.mark.e2e
def test_a_sequence_run_split_by_sigterm_mid_epoch_ends_bit_identical_to_a_straight_one(tmp_path):
  from tests.test_reliability import split_by_sigterm_matches_straight
  args = [PY, "main.py", "--config=configs/tasks.py:sequence", "--config.deterministic=True",
          "--config.train.steps=300", "--config.train.steps_per_loop=5", "--config.eval.every_steps=0",
          "--config.checkpoint.every_steps=100", "--config.checkpoint.best_metric=", "--config.export=False",
          "--config.summary.progress_bar=off"]
  straight, resumed = split_by_sigterm_matches_straight(args, tmp_path, wait_for=r"step 1[1-7]\d/300")
  assert re.search(r"\d+ examples/s", straight)
  step = int(re.search(r"restored .*ckpt-(\d+)", resumed).group(1))
  assert step % 100 and step % 64, step  # a preemption save, inside an epoch (64 steps) and a checkpoint interval
