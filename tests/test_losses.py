import os
import sys

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import rules
from loops.modeling import losses
from tests.conftest import load_config

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "user_losses")


def loss_config(name, **kwargs):
  return ml_collections.ConfigDict({"name": name, "label_smoothing": 0.0, "kwargs": kwargs})


LABELS = tf.constant([0, 2, 1], tf.int64)
LOGITS = tf.constant([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0], [1.0, 1.0, 1.0]])


def test_cross_entropy_is_per_example():
  values = losses.build(loss_config("sparse_categorical_crossentropy"))(LABELS, LOGITS).numpy()
  expected = -np.log(tf.nn.softmax(LOGITS).numpy()[np.arange(3), LABELS.numpy()])
  np.testing.assert_allclose(values, expected, rtol=1e-6)


@pytest.mark.parametrize("dtype, expected", [(tf.float64, tf.float64), (tf.bfloat16, tf.float32),
                                             (tf.float32, tf.float32)])
def test_losses_are_float32_but_in_the_checks_float64_floor(dtype, expected):
  """The replica check's float64 floor must not round the loss (nor the built-in's logits) in float32."""
  from loops.task import classification
  model = keras.Sequential([keras.Input([3], dtype=dtype), keras.layers.Dense(4, dtype=dtype)])
  logits, _ = classification.forward(model, tf.ones([2, 3], dtype), training=False)
  per_example = losses.build(ml_collections.ConfigDict({"name": "", "kwargs": {}, "label_smoothing": 0.1}))(
      tf.constant([0, 3]), logits)
  assert (logits.dtype, per_example.dtype) == (expected, expected)


def test_label_smoothing_matches_the_formula():
  c = loss_config("sparse_categorical_crossentropy")
  c.label_smoothing = 0.3
  values = losses.build(c)(LABELS, LOGITS).numpy()
  targets = tf.one_hot(LABELS, 3).numpy() * 0.7 + 0.1
  expected = -(targets * tf.nn.log_softmax(LOGITS).numpy()).sum(axis=1)
  np.testing.assert_allclose(values, expected, rtol=1e-6)


def test_user_loss_by_import_path_with_kwargs(monkeypatch):
  monkeypatch.syspath_prepend(FIXTURES)
  values = losses.build(loss_config("my_losses:focal_loss", gamma=0.0))(LABELS, LOGITS).numpy()
  plain = losses.build(loss_config("sparse_categorical_crossentropy"))(LABELS, LOGITS).numpy()
  np.testing.assert_allclose(values, plain, rtol=1e-6)  # focal loss with gamma 0 is cross-entropy


def test_a_reduced_loss_is_rejected_naming_the_function(monkeypatch):
  monkeypatch.syspath_prepend(FIXTURES)
  with pytest.raises(ConfigError, match=r"loss 'my_losses:reduced_loss' returned shape \[\]; expected one loss "
                                        r"per example, shape \[3\]"):
    losses.build(loss_config("my_losses:reduced_loss"))(LABELS, LOGITS)


@pytest.mark.parametrize("name, message", [
    ("no_such_module:f", "cannot import module 'no_such_module' for loss.name='no_such_module:f'"),
    ("my_losses:nothing", "module 'my_losses' has no 'nothing' \\(loss.name='my_losses:nothing'\\)"),
    ("cross_entropy", "unknown loss 'cross_entropy'"),
])
def test_bad_loss_names(name, message, monkeypatch):
  monkeypatch.syspath_prepend(FIXTURES)
  c = load_config("digits_cnn")
  c.loss.name = name
  with pytest.raises(ConfigError, match=message):
    rules.check(c)


def test_registry_focal_loss_matches_the_formula():
  values = losses.build(loss_config("focal", gamma=2.0, alpha=0.25))(LABELS, LOGITS).numpy()
  p = tf.nn.softmax(LOGITS).numpy()[np.arange(3), LABELS.numpy()]
  np.testing.assert_allclose(values, -0.25 * (1 - p) ** 2 * np.log(p), rtol=1e-5)


def test_multiclass_hinge_is_per_example():
  values = losses.build(loss_config("multiclass_hinge"))(LABELS, LOGITS).numpy()
  logits = LOGITS.numpy()
  true = logits[np.arange(3), LABELS.numpy()]
  other = np.where(np.eye(3)[LABELS.numpy()] == 1, -np.inf, logits).max(axis=1)
  np.testing.assert_allclose(values, np.maximum(0.0, 1 + other - true), rtol=1e-6)


def test_soft_and_one_hot_labels_in_the_built_in_cross_entropy():
  ce = losses.build(loss_config("sparse_categorical_crossentropy"))
  one_hot = tf.one_hot(LABELS, 3)
  np.testing.assert_allclose(ce(one_hot, LOGITS).numpy(), ce(LABELS, LOGITS).numpy(), rtol=1e-6)
  soft = tf.constant([[0.7, 0.3, 0.0], [0.0, 0.5, 0.5], [0.2, 0.2, 0.6]])
  expected = -(soft.numpy() * tf.nn.log_softmax(LOGITS).numpy()).sum(axis=1)
  np.testing.assert_allclose(ce(soft, LOGITS).numpy(), expected, rtol=1e-6)
  np.testing.assert_array_equal(losses.hard_labels(soft).numpy(), [0, 1, 2])
  for name in ("focal", "multiclass_hinge"):
    fn = losses.build(loss_config(name))
    np.testing.assert_allclose(fn(one_hot, LOGITS).numpy(), fn(LABELS, LOGITS).numpy(), rtol=1e-6)


def test_a_loss_gets_exactly_the_keywords_it_declares(monkeypatch):
  monkeypatch.syspath_prepend(FIXTURES)
  import keyword_losses
  import my_losses
  images = tf.ones([3, 2, 2, 1])
  outputs = {"logits": LOGITS, "embedding": tf.ones([3, 4])}
  given = dict(images=images, outputs=outputs, step=tf.Variable(5, dtype=tf.int64))
  plain = losses.build(loss_config("sparse_categorical_crossentropy"))(LABELS, LOGITS, **given).numpy()

  def value(name):
    return losses.build(loss_config(f"keyword_losses:{name}"))(LABELS, LOGITS, **given).numpy()

  np.testing.assert_allclose(value("uses_images"), plain * 1.5, rtol=1e-6)
  np.testing.assert_allclose(value("uses_outputs"), plain + 0.04, rtol=1e-6)
  np.testing.assert_allclose(value("uses_step"), 0.0)
  keyword_losses.RECORDED.clear()
  losses.build(loss_config("keyword_losses:records_keywords"))(LABELS, LOGITS, **given)
  assert keyword_losses.RECORDED == [["images", "outputs", "step"]]
  with pytest.raises(TypeError):  # focal_loss declares none of them: it is called with (labels, logits) only
    my_losses.focal_loss(LABELS, LOGITS, images=images)
  losses.build(loss_config("my_losses:focal_loss"))(LABELS, LOGITS, **given)
