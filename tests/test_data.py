import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import data
from data import sources
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
  assert images.shape == (8, 128, 128, 3) and data.output_shape(source, cfg) == (128, 128, 3)
  assert float(tf.reduce_min(images)) < -1.5  # (0 - 0.49) / 0.25


def test_bad_normalisation_is_rejected():
  cfg = digits_config()
  cfg.mean, cfg.std = (0.5, 0.5, 0.5), (0.2, 0.2, 0.2)
  with pytest.raises(ValueError, match="need 1 values"):
    data.train_dataset(data.load(cfg), cfg, batch_size=8, steps_per_epoch=1, seed=0)


@pytest.mark.parametrize("name, shape, classes", [
    ("mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10), ("quickdraw_bitmap", (28, 28, 1), 345)])
def test_tfds_datasets_load_through_the_real_tfds_path(name, shape, classes, tmp_path):
  cfg = digits_config()
  cfg.name, cfg.data_dir = name, str(tmp_path)
  for in_memory in (True, False):
    cfg.in_memory = in_memory
    with tfds.testing.mock_data(num_examples=40):
      source = data.load(cfg)
      assert (source.image_shape, source.num_classes, source.train_size) == (shape, classes, 40)
      images, labels = next(iter(data.train_dataset(source, cfg, batch_size=8, steps_per_epoch=5, seed=0)))
    assert images.shape == (8,) + shape and (source.train_arrays is not None) == in_memory


def test_missing_tfds_data_says_how_to_provide_it(tmp_path):
  cfg = digits_config()
  cfg.name, cfg.data_dir, cfg.download = "cifar10", str(tmp_path), False
  with pytest.raises(FileNotFoundError, match=r"tfds dataset 'cifar10' is not in .*`tfds build cifar10 --data_dir=DIR`"):
    data.load(cfg)


def test_failed_download_says_how_to_provide_it(tmp_path, monkeypatch):
  def no_network(self, *args, **kwargs):
    raise ConnectionError("network is unreachable")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
  cfg = digits_config()
  cfg.name, cfg.data_dir = "mnist", str(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"could not be downloaded \(ConnectionError: network is unreachable\)"):
    data.load(cfg)


def test_unknown_dataset_suggests_the_nearest_name():
  cfg = digits_config()
  cfg.name = "cifar1O"
  with pytest.raises(LookupError, match=r"unknown dataset 'cifar1O' \(did you mean 'cifar10'\?\); valid: digits"):
    data.load(cfg)


def test_too_few_examples_for_one_batch():
  source = data.load(digits_config())
  with pytest.raises(ValueError, match="fewer than one global batch"):
    data.train_dataset(source, digits_config(), batch_size=2048, steps_per_epoch=0, seed=0)


def test_sources_registry_names():
  assert {"digits", "synthetic", "mnist", "cifar10", "quickdraw_bitmap"} <= set(sources.SOURCES)
