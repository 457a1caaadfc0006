"""Datasets as files: an .npz of keras.datasets arrays (in memory), and image folders streamed from disk."""

import io
import math
import re

import numpy as np
import pytest
import tensorflow as tf

import data
from data import sources
from errors import ConfigError
from loops import rules
from tests.conftest import load_config
from tests.test_data import batches, make_image_folder, truncated_png


def npz_arrays(rank=3, train=20, test=10):
  """Distinct uint8 images of 8x8 (rank 3) or 8x8x1 (rank 4); train and test labels 0..3."""
  rng = np.random.default_rng(7)
  shape = (8, 8) if rank == 3 else (8, 8, 1)
  return {"x_train": rng.integers(0, 256, (train,) + shape, dtype=np.uint8),
          "y_train": np.arange(train, dtype=np.uint8) % 4,
          "x_test": rng.integers(0, 256, (test,) + shape, dtype=np.uint8),
          "y_test": (np.arange(test, dtype=np.int32) % 4).reshape(-1, 1)}  # (N, 1), as keras' cifar10 gives them


def save_npz(path, **arrays):
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  with tf.io.gfile.GFile(str(path), "wb") as f:
    f.write(buffer.getvalue())
  return str(path)


def npz_config(path):
  c = load_config("digits_cnn").data
  c.name, c.data_dir = "npz", str(path)
  return c


@pytest.mark.parametrize("rank", [3, 4])
def test_npz_round_trip_keeps_images_and_labels_exactly(rank, tmp_path):
  arrays = npz_arrays(rank)
  source = data.load(npz_config(save_npz(tmp_path / "d.npz", **arrays)))
  assert (source.train_size, source.eval_size, source.image_shape, source.max_value) == (20, 10, (8, 8, 1), 255.0)
  assert source.num_classes == 4  # the largest train label + 1
  images, labels = source.train_arrays
  np.testing.assert_array_equal(images, arrays["x_train"].reshape(20, 8, 8, 1))
  np.testing.assert_array_equal(labels, arrays["y_train"])
  assert images.dtype == np.uint8 and labels.dtype == np.int64
  eval_images, eval_labels = (np.stack(a) for a in zip(*source.eval.as_numpy_iterator()))
  np.testing.assert_array_equal(eval_images, arrays["x_test"].reshape(10, 8, 8, 1))
  np.testing.assert_array_equal(eval_labels, arrays["y_test"][:, 0])


def test_an_npz_on_a_tf_io_gfile_path_is_read():
  arrays = npz_arrays(4)
  source = data.load(npz_config(save_npz("ram://file_sources/mnist_like.npz", **arrays)))
  assert source.name == "npz:ram://file_sources/mnist_like.npz"
  np.testing.assert_array_equal(source.train_arrays[0], arrays["x_train"])
  np.testing.assert_array_equal(source.train_arrays[1], arrays["y_train"])


def test_npz_splits_name_their_arrays(tmp_path):
  arrays = npz_arrays()
  path = save_npz(tmp_path / "d.npz", **arrays, x_val=arrays["x_test"][:3], y_val=np.array([1, 2, 3]))
  c = npz_config(path)
  c.eval_split = "val"
  source = data.load(c)
  assert (source.train_size, source.eval_size, source.num_classes) == (20, 3, 4)


def broken(**changes):
  arrays = npz_arrays()
  arrays.update(changes)
  return {key: value for key, value in arrays.items() if value is not None}


@pytest.mark.parametrize("arrays, message", [
    (broken(x_test=None), "npz file '{p}' has no x_test (data.train_split='train' and data.eval_split='test' need "
                          "x_train, y_train, x_test, y_test); it has: x_train, y_train, y_test"),
    (broken(x_train=np.zeros((20, 64), np.uint8)), "npz file '{p}': x_train must be uint8 images (N, H, W) or "
                                                   "(N, H, W, C) with pixels 0-255, got uint8 of shape (20, 64)"),
    (broken(x_train=np.zeros((20, 8, 8), np.float32)), "npz file '{p}': x_train must be uint8 images (N, H, W) or "
                                                       "(N, H, W, C) with pixels 0-255, got float32 of shape "
                                                       "(20, 8, 8)"),
    (broken(y_train=np.zeros(20, np.float32)), "npz file '{p}': y_train must be integer class ids of shape (N,) or "
                                               "(N, 1), got float32 of shape (20,)"),
    (broken(y_test=np.zeros(9, np.int64)), "npz file '{p}': x_test has 10 images but y_test has 9 labels; they must "
                                           "be equally many"),
    (broken(y_train=np.arange(20) - 1), "npz file '{p}': y_train has negative labels (smallest -1); class ids must "
                                        "be 0, 1, ..., num_classes - 1"),
    (broken(x_test=np.zeros((10, 8, 8, 3), np.uint8)), "npz file '{p}': x_test images are (8, 8, 3) but x_train are "
                                                       "(8, 8, 1) (height, width, channels); they must match"),
    (broken(y_train=np.arange(20) % 4 + 10), "npz file '{p}': y_train must hold class ids 0..C-1 with every class "
                                             "present; ids 0, 1, 2, 3, 4, 5, 6, 7, ... (10 in all) of 0..13 have no "
                                             "example (relabel to 0..3)"),
    (broken(y_test=np.array([0, 1, 7, 9, 9, 0, 1, 2, 3, 3])), "npz file '{p}': y_test has class ids 7, 9 that y_train "
                                                              "lacks (classes 0..3); the model could never predict "
                                                              "them"),
])
def test_a_bad_npz_is_one_line_naming_what_is_wrong(arrays, message, tmp_path):
  path = save_npz(tmp_path / "d.npz", **arrays)
  with pytest.raises(ConfigError, match=f"^{re.escape(message.format(p=path))}$"):
    data.load(npz_config(path))


def test_a_damaged_member_of_an_npz_is_one_line(tmp_path):
  path = save_npz(tmp_path / "d.npz", **npz_arrays())
  content = bytearray(open(path, "rb").read())
  content[200] ^= 0xFF  # inside x_test's data (the first member): its CRC-32 no longer matches
  open(path, "wb").write(bytes(content))
  with pytest.raises(ConfigError, match=r"^npz file '.*': x_train or y_train cannot be read \(Bad CRC-32 for file "
                                        r"'x_train.npy'\); the file is damaged or not written by np.savez$"):
    data.load(npz_config(path))


def test_python_objects_in_a_tasks_arrays_are_one_line_naming_the_file_or_function_and_the_array(tmp_path):
  ragged = np.array([np.zeros(2), np.zeros(3)] * 5, dtype=object)
  path = save_npz(tmp_path / "d.npz", f_train=ragged, t_train=np.zeros(10), f_test=np.zeros((4, 2)), t_test=np.zeros(4))
  config = npz_config(path)
  config.npz.features, config.npz.targets = ("f",), ("t",)
  with pytest.raises(ConfigError, match=f"^{re.escape(f'npz file {path!r}')}: array 'f_train' cannot be read: it holds "
                                        r"Python objects \(dtype object\), which are not read"):
    data.load(config)
  from data import user_source
  with pytest.raises(ConfigError, match=r"^data.name='mine:rows': rows\('train'\) returned features\['ids'\] as Python "
                                        r"objects \(dtype object, e\.g\. rows of different lengths\)"):
    user_source.load("mine:rows", lambda split: ({"ids": ragged, "mask": np.zeros((10, 2))}, np.zeros(10)))


def test_an_empty_class_folder_is_refused(tmp_path):
  root = make_image_folder(tmp_path / "images")
  (root / "train" / "bird").mkdir()
  with pytest.raises(ConfigError, match=r"^image folder '.*/train': class folder\(s\) bird hold no images; a class "
                                        r"without training images cannot be learned"):
    data.load(folder_config(root, in_memory=True))


def test_a_missing_npz_file_says_how_to_provide_it(tmp_path):
  path = tmp_path / "nothing.npz"
  with pytest.raises(ConfigError, match="^" + re.escape(
      f"npz file '{path}' does not exist; write one with np.savez(PATH, x_train=..., y_train=..., x_test=..., "
      f"y_test=...) (e.g. the arrays of keras.datasets.mnist.load_data()) and set data.data_dir=PATH") + "$"):
    data.load(npz_config(path))


@pytest.mark.parametrize("content, what", [(b"x_train,y_train\n1,2\n", "not a zip archive"),
                                           (None, "one .npy array")])
def test_a_file_that_is_not_an_npz_archive_is_refused(content, what, tmp_path):
  path = tmp_path / "d.npz"
  if content is None:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(3))
    content = buffer.getvalue()
  path.write_bytes(content)
  with pytest.raises(ConfigError, match=f"^'{re.escape(str(path))}' is {what}, not an .npz archive of x_train, "):
    data.load(npz_config(path))


@pytest.mark.parametrize("key, value, message", [
    ("data_dir", None, "data.name='npz' needs data.data_dir=PATH.npz (a local or tf.io.gfile path of an .npz holding "
                       "x_train, y_train, x_test, y_test), got None"),
    ("data_dir", "/data/mnist", "data.name='npz' needs data.data_dir=PATH.npz (a local or tf.io.gfile path of an .npz "
                                "holding x_train, y_train, x_test, y_test), got '/data/mnist'"),
    ("train_split", "train[:80%]", "data.train_split='train[:80%]' cannot name an npz split: split S reads the arrays "
                                   "x_S and y_S (train, test, or any other suffix the file has)"),
])
def test_the_up_front_check_refuses_npz_settings_it_cannot_use(key, value, message):
  c = load_config("digits_cnn")
  c.data.name, c.data.data_dir = "npz", "/data/mnist.npz"
  c.data[key] = value
  with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
    rules.check(c)


def folder_config(root, in_memory, policy="fail", image_size=None):
  c = load_config("digits_cnn").data
  c.name, c.data_dir, c.in_memory = "image_folder", str(root), in_memory
  c.corrupt_images, c.image_size = policy, image_size
  return c


def one_epoch(source, cfg, batch_size=4, num_shards=1, shard_index=0):
  """Multiset of (preprocessed image bytes, label) of one epoch of this shard's train stream."""
  steps = source.train_size // (batch_size * num_shards)
  got = batches(data.train_dataset(source, cfg, batch_size=batch_size, steps_per_epoch=steps, seed=3,
                                   num_shards=num_shards, shard_index=shard_index), steps)
  return sorted((x.tobytes(), int(y)) for images, labels in got for x, y in zip(images, labels))


@pytest.mark.parametrize("image_size", [None, 8])
def test_a_streamed_folder_yields_the_in_memory_examples(image_size, tmp_path):
  root = make_image_folder(tmp_path)
  memory = data.load(folder_config(root, True, image_size=image_size))
  streamed = data.load(folder_config(root, False, image_size=image_size))
  assert streamed.train_arrays is None and streamed.decode is not None  # really streamed: records, not images
  for key in ("train_size", "eval_size", "num_classes", "image_shape", "name"):
    assert getattr(streamed, key) == getattr(memory, key), key
  assert one_epoch(streamed, folder_config(root, False, image_size=image_size)) == one_epoch(
      memory, folder_config(root, True, image_size=image_size))
  # eval: the same batches in the same order, padded to whole batches with weight-0 zero images
  for (x1, y1, w1), (x2, y2, w2) in zip(batches(data.eval_dataset(streamed, folder_config(root, False), batch_size=4), 9),
                                        batches(data.eval_dataset(memory, folder_config(root, True), batch_size=4), 9)):
    np.testing.assert_array_equal(x1, x2)
    assert y1.tolist() == y2.tolist() and w1.tolist() == w2.tolist()


def test_streamed_shards_are_disjoint_and_cover_the_epoch(tmp_path):
  root = make_image_folder(tmp_path)
  cfg = folder_config(root, False)
  source = data.load(cfg)
  whole = one_epoch(source, cfg)
  shards = [one_epoch(source, cfg, batch_size=2, num_shards=2, shard_index=i) for i in range(2)]
  assert len(shards[0]) == len(shards[1]) == 6 and sorted(shards[0] + shards[1]) == whole


def test_a_streamed_folder_on_a_tf_io_gfile_path(tmp_path):
  local = make_image_folder(tmp_path)
  root = "ram://file_sources/folder"
  for path in local.rglob("*.png"):
    tf.io.gfile.makedirs(f"{root}/{path.parent.relative_to(local)}")
    tf.io.gfile.copy(str(path), f"{root}/{path.relative_to(local)}", overwrite=True)
  source = data.load(folder_config(root, False))
  assert (source.train_size, source.eval_size, source.num_classes, source.image_shape) == (12, 6, 2, (10, 12, 3))
  assert one_epoch(source, folder_config(root, False)) == one_epoch(data.load(folder_config(local, True)),
                                                                    folder_config(local, True))


def test_a_corrupt_file_stops_a_streamed_load_naming_it(tmp_path):
  root = make_image_folder(tmp_path, corrupt=[("test", "dog", "bad.png", truncated_png())])
  with pytest.raises(ConfigError, match="^" + re.escape(
      f"image {root}/test/dog/bad.png is unreadable or corrupt (Invalid PNG. Failed to initialize decoder.); set "
      f"data.corrupt_images=skip to leave such files out (valid: fail, skip)") + "$"):
    data.load(folder_config(root, False))


def test_corrupt_files_are_left_out_of_a_streamed_folder_and_counted(tmp_path, caplog):
  root = make_image_folder(tmp_path, corrupt=[("train", "dog", "bad.png", truncated_png()),
                                              ("train", "cat", "zero.jpg", b""),
                                              ("test", "cat", "text.png", b"not an image")])
  with caplog.at_level("WARNING"):
    source = data.load(folder_config(root, False, "skip"))
  assert (source.train_size, source.eval_size) == (12, 6)
  assert (f"skipped 2 unreadable or corrupt image(s) in {root}/train (data.corrupt_images=skip): "
          f"{root}/train/cat/zero.jpg, {root}/train/dog/bad.png") in caplog.text
  assert f"skipped 1 unreadable or corrupt image(s) in {root}/test (data.corrupt_images=skip): " in caplog.text
  memory = data.load(folder_config(root, True, "skip"))
  assert one_epoch(source, folder_config(root, False, "skip")) == one_epoch(memory, folder_config(root, True, "skip"))
  eval_weights = np.concatenate([b[2] for b in batches(data.eval_dataset(source, folder_config(root, False),
                                                                         batch_size=4), 9)])
  assert eval_weights.tolist() == [1.0] * 6 + [0.0] * 2  # 6 real, padded to 8: the skipped file is not in it


def test_a_streamed_folder_of_mixed_sizes_needs_image_size(tmp_path):
  root = make_image_folder(tmp_path)
  (root / "test" / "dog" / "big.png").write_bytes(tf.io.encode_png(np.zeros((16, 16, 3), np.uint8)).numpy())
  with pytest.raises(ValueError, match="^" + re.escape(f"images differ in size ({root}/test/dog/big.png is (16, 16), "
                                                       f"(10, 12) before): set data.image_size to resize them all")):
    data.load(folder_config(root, False))
  assert data.load(folder_config(root, False, image_size=8)).eval_size == 7


def tiny_run(c, workdir):
  from loops import run
  c.train.epochs, c.train.steps, c.train.global_batch_size, c.train.steps_per_loop = None, 6, 4, 3
  c.eval.every_steps = c.checkpoint.every_steps = 0
  return run.train_and_evaluate(c, str(workdir))


def assert_finite_and_over_real_examples(summary, eval_size):
  assert math.isfinite(summary["train/loss"]) and math.isfinite(summary["eval/loss"])
  correct = summary["eval/accuracy"] * eval_size  # a whole number: weight-0 padding rows are not counted
  assert 0.0 <= summary["train/accuracy"] <= 1.0 and abs(correct - round(correct)) < 1e-4, summary


@pytest.mark.e2e
def test_a_run_trains_on_an_npz_file(tmp_path):
  c = load_config("digits_cnn")
  c.data = npz_config(save_npz(tmp_path / "d.npz", **npz_arrays()))
  summary = tiny_run(c, tmp_path / "run")
  assert summary["step"] == 6
  assert_finite_and_over_real_examples(summary, eval_size=10)


def test_a_run_trains_on_a_streamed_folder_with_two_replicas(tmp_path):
  c = load_config("digits_cnn")
  c.strategy, c.cpu_replicas = "mirrored", 2
  c.data = folder_config(make_image_folder(tmp_path / "images"), False, image_size=8)
  summary = tiny_run(c, tmp_path / "run")
  assert summary["step"] == 6 and summary["replicas"] == 2
  assert_finite_and_over_real_examples(summary, eval_size=6)


def named_npz(tmp_path):
  """Arrays a task reads: int32 tokens beyond 255 and a float mask (features), multi-hot float targets."""
  rng = np.random.default_rng(3)
  arrays = {}
  for split, n in (("train", 24), ("test", 10)):
    arrays[f"tokens_{split}"] = rng.integers(0, 50_000, (n, 16), dtype=np.int32)
    arrays[f"mask_{split}"] = (rng.random((n, 16)) < 0.5).astype(np.float32)
    arrays[f"tags_{split}"] = (rng.random((n, 5)) < 0.3).astype(np.float32)
  return arrays, save_npz(tmp_path / "named.npz", **arrays)


def test_npz_named_arrays_are_a_tasks_features_and_targets(tmp_path):
  arrays, path = named_npz(tmp_path)
  c = npz_config(path)
  c.npz.features, c.npz.targets = ("tokens", "mask"), ("tags",)
  source = data.load(c)
  assert (source.train_size, source.eval_size, source.image_shape) == (24, 10, None)
  features, targets = source.train.element_spec
  assert set(features) == {"tokens", "mask"} and features["tokens"].dtype == tf.int32 and targets.shape == (5,)
  (features, tags, weights), = list(data.eval_dataset(source, c, batch_size=16))  # 10 real rows, 6 padding
  np.testing.assert_array_equal(features["tokens"][:10], arrays["tokens_test"])
  np.testing.assert_array_equal(tags[:10], arrays["tags_test"])
  np.testing.assert_array_equal(weights, [1.0] * 10 + [0.0] * 6)


@pytest.mark.parametrize("features, targets, message", [
    (("tokens",), (), r"data.npz.features=\('tokens',\) and data.npz.targets=\(\): name both"),
    (("tokens", "words"), ("tags",), r"has no words_train \(data.npz.features and data.npz.targets name arrays read "
                                      r"as <name>_train\); it has: tokens_train, "),
])
def test_npz_named_arrays_that_are_not_there_are_one_line(features, targets, message, tmp_path):
  c = npz_config(named_npz(tmp_path)[1])
  c.npz.features, c.npz.targets = features, targets
  with pytest.raises(ConfigError, match=message):
    data.load(c)


@pytest.mark.e2e
def test_a_task_on_named_npz_arrays_trains_exactly_as_on_the_same_arrays_from_a_function(tmp_path):
  from examples.tasks.regression import digit_values
  from loops import run
  (train_x, train_y), (eval_x, eval_y) = digit_values("train"), digit_values("eval")
  path = save_npz(tmp_path / "values.npz", pixels_train=train_x, value_train=train_y, pixels_eval=eval_x,
                  value_eval=eval_y)
  summaries = []
  for name, workdir in (("npz", "from_npz"), ("examples.tasks.regression:digit_values", "from_function")):
    c = load_config("tasks", "regression")
    c.data.name, c.deterministic, c.export = name, True, False
    if name == "npz":
      c.data.data_dir, c.data.eval_split = str(path), "eval"
      c.data.npz.features, c.data.npz.targets = ("pixels",), ("value",)
    c.train.steps, c.train.steps_per_loop, c.eval.every_steps, c.checkpoint.every_steps = 20, 10, 0, 0
    summaries.append(run.train_and_evaluate(c, str(tmp_path / workdir)))
  assert summaries[0]["step"] == 20 and math.isfinite(summaries[0]["eval/mae"])
  for key in ("train/loss", "eval/mae", "eval/mse"):
    assert summaries[0][key] == summaries[1][key], key
