import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import data
from data import sources
from loops import rules
from loops import plan as plan_lib
from tests.conftest import load_config


def digits_config():
  return load_config("digits_cnn").data


def batches(ds, n):
  return [tuple(t.numpy() for t in b) for b in ds.take(n)]


def test_digits_is_a_fixed_stratified_split():
  source = data.load(digits_config())
  assert (source.train_size, source.eval_size, source.num_classes, source.image_shape) == (1437, 360, 10, (8, 8, 1))
  _, eval_labels = zip(*[(x, y) for x, y in source.eval.as_numpy_iterator()])
  counts = np.bincount(eval_labels, minlength=10)
  assert counts.min() >= 35 and counts.max() <= 37  # stratified: ~36 of each digit
  again = data.load(digits_config())
  np.testing.assert_array_equal(source.train_arrays[1], again.train_arrays[1])


def test_train_images_are_scaled_to_unit_range_and_batched_by_the_given_size():
  source = data.load(digits_config())
  ds = data.train_dataset(source, digits_config(), batch_size=32, steps_per_epoch=44, seed=0)
  images, labels = next(iter(ds))
  assert images.shape == (32, 8, 8, 1) and images.dtype == tf.float32 and labels.shape == (32,)
  assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) == pytest.approx(1.0)


def test_an_epoch_is_a_permutation_and_epochs_differ():
  source = data.load(digits_config())
  per_epoch = source.train_size // 100
  ds = data.train_dataset(source, digits_config(), batch_size=100, steps_per_epoch=per_epoch, seed=3)
  stream = [b[1] for b in batches(ds, 2 * per_epoch)]
  first, second = np.concatenate(stream[:per_epoch]), np.concatenate(stream[per_epoch:])
  expected = np.bincount(source.train_arrays[1], minlength=10)
  assert np.all(np.bincount(first, minlength=10) <= expected)
  assert np.abs(np.bincount(first, minlength=10) - expected).sum() == source.train_size - len(first)
  assert not np.array_equal(first, second)


def test_resume_from_a_step_continues_the_same_stream():
  source = data.load(digits_config())
  cfg = digits_config()
  cfg.random_flip = True
  full = batches(data.train_dataset(source, cfg, batch_size=64, steps_per_epoch=22, seed=5), 30)
  resumed = batches(data.train_dataset(source, cfg, batch_size=64, steps_per_epoch=22, seed=5, start_step=19), 11)
  for (x1, y1), (x2, y2) in zip(full[19:], resumed):
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(x1, x2)


def test_shard_indices_are_disjoint_and_cover_the_epoch_exactly():
  """Synthetic images are all distinct, so an image identifies its example."""
  cfg = load_config("digits_cnn", "synthetic").data
  cfg.synthetic.train_examples, cfg.synthetic.image_shape = 256, (4, 4, 3)
  source = data.load(cfg)
  shard_rows = []
  for index in range(4):
    ds = data.train_dataset(source, cfg, batch_size=16, steps_per_epoch=4, seed=2, num_shards=4, shard_index=index)
    shard_rows.append({r.tobytes() for b in batches(ds, 4) for r in b[0].reshape(16, -1)})
  assert all(len(rows) == 64 for rows in shard_rows)
  union = set().union(*shard_rows)
  assert len(union) == 256  # disjoint (4 x 64 distinct) and covering all 256 examples once


def test_eval_is_padded_with_zero_weights_to_whole_global_batches():
  source = data.load(digits_config())
  ds = data.eval_dataset(source, digits_config(), batch_size=64)
  weights = np.concatenate([b[2] for b in batches(ds, 100)])
  assert len(weights) == 384 and weights.sum() == source.eval_size == 360


def test_preprocessing_resizes_and_normalises():
  cfg = load_config("resnet50_mirrored", "synthetic").data
  source = data.load(cfg)
  images, _, _ = next(iter(data.eval_dataset(source, cfg, batch_size=8)))
  assert images.shape == (8, 128, 128, 3) and data.output_shape(source, cfg.image_size) == (128, 128, 3)
  assert float(tf.reduce_min(images)) < -1.5  # (0 - 0.49) / 0.25


def test_bad_normalisation_is_rejected():
  c = load_config("digits_cnn")
  c.data.mean, c.data.std = (0.5, 0.5, 0.5), (0.2, 0.2, 0.2)
  source = data.load(c.data)
  with pytest.raises(ValueError, match=r"data.mean and data.std need 1 values \(one per channel of dataset "
                                       r"'digits'\), got 3"):
    rules.check_derived(c, plan_lib.derive(c.train, c.optimizer, 1, source.train_size), source)


@pytest.mark.parametrize("name, shape, classes", [
    ("mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10), ("quickdraw_bitmap", (28, 28, 1), 345)])
def test_tfds_datasets_load_through_the_real_tfds_path(name, shape, classes, tmp_path, monkeypatch):
  monkeypatch.setattr(sources, "network_unreachable", lambda: None)  # mock_data stands in for the download
  cfg = digits_config()
  cfg.name, cfg.data_dir = name, str(tmp_path)
  with tfds.testing.mock_data(num_examples=40):  # in memory: mock_data writes no shard files to stream
    source = data.load(cfg)
    assert (source.image_shape, source.num_classes, source.train_size) == (shape, classes, 40)
    images, labels = next(iter(data.train_dataset(source, cfg, batch_size=8, steps_per_epoch=5, seed=0)))
  assert images.shape == (8,) + shape and source.train_arrays is not None


def test_missing_tfds_data_says_how_to_provide_it(tmp_path):
  cfg = digits_config()
  cfg.name, cfg.data_dir, cfg.download = "cifar10", str(tmp_path), False
  with pytest.raises(FileNotFoundError, match=r"tfds dataset 'cifar10' is not in .*`tfds build cifar10 --data_dir=DIR`"):
    data.load(cfg)


def test_without_network_a_missing_tfds_dataset_fails_at_once_without_trying_to_download(tmp_path, monkeypatch):
  def must_not_download(self, *args, **kwargs):
    raise AssertionError("download attempted without network")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", must_not_download)
  monkeypatch.setattr(sources, "DOWNLOAD_PROBE", ("no-such-host.invalid", 443))  # unresolvable by definition
  cfg = digits_config()
  cfg.name, cfg.data_dir = "mnist", str(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"tfds dataset 'mnist' is not in .* and this machine has no network "
                                              r"\(no-such-host.invalid:443 unreachable: .*\); provide it with `tfds"):
    data.load(cfg)


def test_failed_download_says_how_to_provide_it(tmp_path, monkeypatch):
  def no_network(self, *args, **kwargs):
    raise ConnectionError("network is unreachable")

  monkeypatch.setattr(sources, "network_unreachable", lambda: None)  # as on a machine with network
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
  cfg = digits_config()
  cfg.name, cfg.data_dir = "mnist", str(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"could not be downloaded \(ConnectionError: network is unreachable\)"):
    data.load(cfg)


def test_unknown_dataset_suggests_the_nearest_name():
  c = load_config("digits_cnn")
  c.data.name = "cifar1O"
  with pytest.raises(LookupError, match=r"unknown dataset 'cifar1O' \(did you mean 'cifar10'\?\); valid: digits"):
    rules.check(c)


def test_too_few_examples_for_one_batch():
  c = load_config("digits_cnn")
  c.train.global_batch_size = 2048
  source = data.load(c.data)
  with pytest.raises(ValueError, match="dataset 'digits' has 1437 train examples: fewer than one global batch of 2048"):
    rules.check_derived(c, plan_lib.derive(c.train, c.optimizer, 1, source.train_size), source)


def test_sources_registry_names():
  assert {"digits", "synthetic", "mnist", "cifar10", "quickdraw_bitmap"} <= set(sources.SOURCES)


def make_image_folder(root, corrupt=()):
  """root/{train,test}/{cat,dog}/*.png: 6 train and 3 test 10x12 RGB images per class (pixel = class colour), plus
  `corrupt` = [(split, class, file name, bytes)] files that are not decodable images."""
  rng = np.random.default_rng(0)
  for split, count in (("train", 6), ("test", 3)):
    for label, name in enumerate(("cat", "dog")):
      folder = root / split / name
      folder.mkdir(parents=True)
      for i in range(count):
        image = np.full((10, 12, 3), 40 + 160 * label, np.uint8) + rng.integers(0, 20, (10, 12, 3), dtype=np.uint8)
        (folder / f"{i}.png").write_bytes(tf.io.encode_png(image).numpy())
  for split, name, filename, content in corrupt:
    (root / split / name / filename).write_bytes(content)
  return root


def folder_config(root, policy="fail", image_size=None):
  c = digits_config()
  c.name, c.data_dir, c.corrupt_images, c.image_size = "image_folder", str(root), policy, image_size
  return c


def test_image_folder_loads_classes_from_sub_directories(tmp_path):
  source = data.load(folder_config(make_image_folder(tmp_path), image_size=8))
  assert (source.train_size, source.eval_size, source.num_classes) == (12, 6, 2)
  images, labels = source.train_arrays
  assert images.shape == (12, 8, 8, 3) and images.dtype == np.uint8
  np.testing.assert_array_equal(labels, [0] * 6 + [1] * 6)
  assert images[labels == 0].mean() < 60 < 200 < images[labels == 1].mean()  # class colours survived decoding


def truncated_png():
  return tf.io.encode_png(np.zeros((10, 12, 3), np.uint8)).numpy()[:40]


def test_a_corrupt_image_fails_naming_the_file(tmp_path):
  root = make_image_folder(tmp_path, corrupt=[("train", "dog", "bad.png", truncated_png())])
  with pytest.raises(ValueError, match=rf"image {root}/train/dog/bad.png is unreadable or corrupt \(.+\); set "
                                       r"data.corrupt_images=skip to leave such files out \(valid: fail, skip\)"):
    data.load(folder_config(root))


def test_corrupt_images_are_skipped_and_counted_when_asked(tmp_path, caplog):
  root = make_image_folder(tmp_path, corrupt=[("train", "dog", "bad.png", truncated_png()),
                                              ("train", "cat", "zero.jpg", b""),
                                              ("test", "cat", "text.png", b"not an image")])
  with caplog.at_level("WARNING"):
    source = data.load(folder_config(root, "skip"))
  assert (source.train_size, source.eval_size) == (12, 6)
  assert f"skipped 2 unreadable or corrupt image(s) in {root}/train (data.corrupt_images=skip)" in caplog.text
  assert f"skipped 1 unreadable or corrupt image(s) in {root}/test" in caplog.text


@pytest.mark.parametrize("setup, message", [
    (lambda root: None, "image folder '{root}/train' does not exist"),
    (lambda root: (root / "train" / "cat").mkdir(parents=True), "image folder '{root}/train': class folder(s) cat hold "
                                                                "no images"),
])
def test_a_missing_or_empty_image_folder_is_one_clear_error(setup, message, tmp_path):
  setup(tmp_path)
  (tmp_path / "test").mkdir(exist_ok=True)
  with pytest.raises((FileNotFoundError, ValueError), match=re.escape(message.format(root=tmp_path))):
    data.load(folder_config(tmp_path))


def test_a_run_trains_on_an_image_folder(tmp_path):
  from loops import run
  c = load_config("digits_cnn")
  c.data = folder_config(make_image_folder(tmp_path / "images"), image_size=8)
  c.train.epochs, c.train.steps, c.train.global_batch_size, c.train.steps_per_loop = None, 4, 4, 2
  c.eval.every_steps = c.checkpoint.every_steps = 0
  summary = run.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["step"] == 4 and 0.0 <= summary["eval/accuracy"] <= 1.0


def test_random_flips_follow_the_example_however_the_global_batch_is_split():
  """Worker w of n gets rows w, w+n, ... of the one-pipeline global batch, flipped alike (multi-worker == mirrored)."""
  cfg = load_config("digits_cnn", "synthetic").data
  cfg.synthetic.train_examples, cfg.synthetic.image_shape, cfg.random_flip = 256, (4, 4, 3), True
  source = data.load(cfg)
  whole = batches(data.train_dataset(source, cfg, batch_size=32, steps_per_epoch=8, seed=1, start_step=3), 4)
  for index in range(2):
    shard = batches(data.train_dataset(source, cfg, batch_size=16, steps_per_epoch=8, seed=1, start_step=3,
                                       num_shards=2, shard_index=index), 4)
    for (x, y), (gx, gy) in zip(shard, whole):
      np.testing.assert_array_equal(y, gy[index::2])
      np.testing.assert_array_equal(x, gx[index::2])
  cfg.random_flip = False
  plain = batches(data.train_dataset(source, cfg, batch_size=32, steps_per_epoch=8, seed=1, start_step=3), 4)
  flipped = [np.array_equal(a, b[:, ::-1]) and not np.array_equal(a, b)
             for (x, _), (p, _) in zip(whole, plain) for a, b in zip(x, p)]
  assert 0.3 < np.mean(flipped) < 0.7  # about half of the examples are mirrored
