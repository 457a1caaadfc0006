"""data/mixing.py and its place in the pipeline: formulas, keys, shards, resume."""

import numpy as np
import pytest
import tensorflow as tf

import data
from data import mixing
from tests.conftest import load_config


def mix_config(mixup=0.0, cutmix=0.0):
  c = load_config("digits_cnn", "synthetic").data
  c.synthetic.train_examples, c.synthetic.image_shape, c.synthetic.num_classes = 256, (8, 8, 3), 10
  c.mixup_alpha, c.cutmix_alpha = mixup, cutmix
  return c


IMAGES = tf.random.stateless_uniform([16, 8, 8, 3], seed=[1, 2])
LABELS = tf.range(16, dtype=tf.int64)  # one class per row: a soft label names the row's partner
CLASSES = 16


def test_mixup_is_the_convex_combination_its_labels_say():
  mix = mixing.make_mix(CLASSES, mixup_alpha=0.4, cutmix_alpha=0.0, seed=0)
  mixed, soft = mix(IMAGES, LABELS, tf.constant(7, tf.int64))
  soft, x = soft.numpy(), IMAGES.numpy()
  np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-6)
  mixed_rows = [r for r in range(16) if soft[r, r] < 1.0]
  assert len(mixed_rows) >= 12
  assert len({round(float(soft[r, r]), 5) for r in mixed_rows}) == 1  # one lambda per batch
  for row in mixed_rows:
    partner = int(np.argsort(soft[row])[-2] if soft[row].argmax() == row else soft[row].argmax())
    share = soft[row, row]
    np.testing.assert_allclose(mixed.numpy()[row], share * x[row] + (1 - share) * x[partner], atol=1e-5)


def test_cutmix_pastes_a_box_whose_area_is_the_label_share():
  mix = mixing.make_mix(CLASSES, mixup_alpha=0.0, cutmix_alpha=1.0, seed=0)
  mixed, soft = mix(IMAGES, LABELS, tf.constant(3, tf.int64))
  changed = np.any(mixed.numpy() != IMAGES.numpy(), axis=-1)  # [16, 8, 8]
  soft = soft.numpy()
  assert sum(soft[r, r] < 1.0 for r in range(16)) >= 12
  for row in range(16):
    own_share = soft[row, row]
    if own_share < 1.0:
      assert changed[row].mean() == pytest.approx(1.0 - own_share, abs=1e-6)
      ys, xs = np.nonzero(changed[row])
      assert changed[row][ys.min():ys.max() + 1, xs.min():xs.max() + 1].all()  # one rectangle


def test_mixes_are_keyed_by_batch_and_reproducible():
  mix = mixing.make_mix(CLASSES, mixup_alpha=0.4, cutmix_alpha=1.0, seed=0)
  first, again, other = (mix(IMAGES, LABELS, tf.constant(k, tf.int64))[1].numpy() for k in (11, 11, 12))
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, other)
  assert mixing.make_mix(10, mixup_alpha=0.0, cutmix_alpha=0.0, seed=0) is None


def take(ds, n):
  return [tuple(t.numpy() for t in batch) for batch in ds.take(n)]


def test_two_pipelines_get_the_rows_of_the_one_global_batch_and_resume_is_exact():
  c = mix_config(mixup=0.4, cutmix=1.0)
  source = data.load(c)
  kwargs = dict(steps_per_epoch=8, seed=3)
  whole = take(data.train_dataset(source, c, batch_size=32, **kwargs), 12)
  shards = [take(data.train_dataset(source, c, batch_size=16, num_shards=2, shard_index=i, **kwargs), 12)
            for i in range(2)]
  for step, (images, labels) in enumerate(whole):
    assert labels.shape == (32, 10)
    for i in range(2):
      np.testing.assert_array_equal(shards[i][step][0], images[i::2], err_msg=f"step {step} shard {i}")
      np.testing.assert_array_equal(shards[i][step][1], labels[i::2])
  resumed = take(data.train_dataset(source, c, batch_size=32, start_step=10, **kwargs), 2)
  for got, want in zip(resumed, whole[10:]):
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
