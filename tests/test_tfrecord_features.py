"""TFRecord files of any named features (data/tfrecord_features.py): parsed into a task's features and targets,
the same global batches on any pipeline split, exact resume, padded eval, one-line errors; a task trains on them."""

import math
import re

import numpy as np
import pytest
import tensorflow as tf

from configs import base
from data import pipeline
from data import sources
from data import tfrecord_features
from errors import ConfigError

FEATURES = ("tokens:int64:16", "mask:float32:16", "tags:float32:5")


def write_split(path, n, rng):
  """n records of int64 tokens beyond 255, a float mask and multi-hot tags; returns the arrays written."""
  arrays = {"tokens": rng.integers(0, 50_000, (n, 16)), "mask": (rng.random((n, 16)) < 0.5).astype(np.float32),
            "tags": (rng.random((n, 5)) < 0.3).astype(np.float32)}
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i in range(n):
      feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=arrays["tokens"][i])),
                 **{k: tf.train.Feature(float_list=tf.train.FloatList(value=arrays[k][i])) for k in ("mask", "tags")}}
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return arrays


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root, rng = tmp_path_factory.mktemp("records"), np.random.default_rng(5)
  written = {"train": write_split(root / "train-0.tfrecord", 70, rng)}
  written["train"] = {k: np.concatenate([v, w]) for (k, v), w in
                      zip(written["train"].items(), write_split(root / "train-1.tfrecord", 58, rng).values())}
  written["test"] = write_split(root / "test-0.tfrecord", 30, rng)
  return str(root / "{split}-*.tfrecord"), written


def data_config(pattern, features=FEATURES, targets=("tags",)):
  d = base.get_config().data
  d.name, d.data_dir, d.shuffle_window = "tfrecord", pattern, 64
  d.tfrecord.features, d.tfrecord.targets = features, targets
  return d


def test_records_become_named_features_and_targets_and_eval_keeps_every_record_once(files):
  pattern, written = files
  d = data_config(pattern)
  source = sources.load(d)
  assert (source.train_size, source.eval_size) == (128, 30)
  features, targets = source.train.element_spec
  assert features["tokens"].dtype == tf.int64 and features["tokens"].shape == (16,) and targets.shape == (5,)
  (features, tags, weights), = list(pipeline.eval_dataset(source, d, batch_size=32))  # 30 real rows, 2 padding
  np.testing.assert_array_equal(features["tokens"][:30], written["test"]["tokens"])
  np.testing.assert_array_equal(tags[:30], written["test"]["tags"])
  np.testing.assert_array_equal(weights, [1.0] * 30 + [0.0] * 2)


def global_batches(source, d, pipelines, start_step=0, steps=12, batch=32):
  streams = [iter(pipeline.train_dataset(source, d, batch_size=batch // pipelines, steps_per_epoch=128 // batch,
                                         seed=7, start_step=start_step, num_shards=pipelines, shard_index=i))
             for i in range(pipelines)]
  out = []
  for _ in range(steps):
    tokens = np.concatenate([next(stream)[0]["tokens"].numpy() for stream in streams])
    out.append(tokens[np.lexsort(tokens.T)])
  return out


def test_one_and_two_pipelines_see_the_same_global_batches_and_a_resume_continues_exactly(files):
  d = data_config(files[0])
  source = sources.load(d)
  one, two = global_batches(source, d, 1), global_batches(source, d, 2)  # 12 steps: three epochs of 4
  assert all(np.array_equal(a, b) for a, b in zip(one, two))
  assert not np.array_equal(one[0], one[4])  # each epoch its own order
  resumed = global_batches(source, d, 2, start_step=6, steps=6)  # mid-epoch
  assert all(np.array_equal(a, b) for a, b in zip(one[6:], resumed))


@pytest.mark.parametrize("features, targets, message", [
    (("tokens:int32:16",), ("tokens",), r"entry 'tokens:int32:16' must be 'name:dtype:shape' with dtype int64, "
                                        r"float32 or string"),
    (FEATURES, ("labels",), r"data.tfrecord.targets=\('labels',\) must name some \(not all\) of "
                            r"data.tfrecord.features \(tokens, mask, tags\)"),
])
def test_a_bad_feature_spec_is_one_line(features, targets, message, files):
  with pytest.raises(ConfigError, match=message):
    sources.load(data_config(files[0], features, targets))


@pytest.mark.parametrize("features, message", [
    (("tokens:int64:12", "mask:float32:16", "tags:float32:5"), "entry 'tokens:int64:12': the records of {first} hold "
                                                               "'tokens' as 16 int64 values, not 12 int64; e.g. "
                                                               "'tokens:int64:16' reads them"),
    (("tokens:float32:16", "mask:float32:16", "tags:float32:5"), "entry 'tokens:float32:16': the records of {first} "
                                                                 "hold 'tokens' as 16 int64 values, not 16 float32"),
    (("tokens:int64:16", "weights:float32:16", "tags:float32:5"), "entry 'weights:float32:16': the records of {first} "
                                                                  "have no feature 'weights' (they have: mask, tags, "
                                                                  "tokens)"),
])
def test_a_feature_the_records_do_not_hold_as_declared_is_one_line_at_load(features, message, files):
  first = files[0].format(split="train").replace("*", "0")
  with pytest.raises(ConfigError, match="^data.tfrecord.features " + re.escape(message.format(first=first))):
    sources.load(data_config(files[0], features))


@pytest.mark.e2e
def test_a_task_trains_on_feature_records(tmp_path):
  from examples.tasks.regression import digit_values
  from loops import run
  from tests.conftest import load_config
  for split in ("train", "eval"):
    images, values = digit_values(split)
    with tf.io.TFRecordWriter(str(tmp_path / f"{split}-0.tfrecord")) as writer:
      for image, value in zip(images, values):
        feature = {"pixels": tf.train.Feature(float_list=tf.train.FloatList(value=image.ravel())),
                   "value": tf.train.Feature(float_list=tf.train.FloatList(value=[value]))}
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  c = load_config("tasks", "regression")
  c.data.name, c.data.data_dir, c.data.eval_split = "tfrecord", str(tmp_path / "{split}-*.tfrecord"), "eval"
  c.data.tfrecord.features, c.data.tfrecord.targets = ("pixels:float32:8x8x1", "value:float32:"), ("value",)
  c.train.steps, c.eval.every_steps, c.export = 300, 0, False
  summary = run.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["step"] == 300 and math.isfinite(summary["eval/mae"])
  assert summary["eval/mae"] < 1.5, summary  # a constant guess of the mean scores 2.5
