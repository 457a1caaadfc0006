"""loops/modeling/model.py and loops/task/classification.py forward: models by import path with kwargs, named outputs, synchronized BatchNorm."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import rules
from loops import private_apis
from loops.task import classification
from loops.modeling import model as model_lib
from tests.conftest import load_config


def config_with(name, **kwargs):
  c = load_config("digits_cnn")
  c.model.name = name
  for key, value in kwargs.items():
    c.model.kwargs[key] = value
  return c


def test_a_model_by_import_path_gets_its_kwargs_and_its_outputs_are_named():
  c = config_with("examples.models:cnn_with_embedding", embedding_dim=5, reconstruct=True)
  rules.check(c)
  model = model_lib.build_model(c.model, c.mixed_precision, (8, 8, 1), 10)
  logits, outputs = classification.forward(model, tf.zeros([2, 8, 8, 1]), training=False)
  assert logits.shape == (2, 10) and logits.dtype == tf.float32
  assert outputs["embedding"].shape == (2, 5) and outputs["reconstruction"].shape == (2, 8, 8, 1)
  exported = model_lib.logits_model(model)
  np.testing.assert_allclose(exported(tf.ones([2, 8, 8, 1])).numpy(), model(tf.ones([2, 8, 8, 1]))["logits"].numpy())


def test_a_plain_output_is_the_logits():
  digits = load_config("digits_cnn")
  model = model_lib.build_model(digits.model, digits.mixed_precision, (8, 8, 1), 10)
  logits, outputs = classification.forward(model, tf.zeros([2, 8, 8, 1]), training=False)
  assert list(outputs) == ["logits"] and logits.shape == (2, 10)
  assert model_lib.logits_model(model) is model


@pytest.mark.parametrize("name, kwargs, message", [
    ("examples.models:cnn_with_embedding", {"embeding_dim": 4},
     r"model.kwargs \{'embeding_dim': 4\} do not fit examples.models:cnn_with_embedding: .*unexpected keyword"),
    ("digits_cnn", {"width": 2}, r"model.kwargs \{'width': 2\} do not fit digits_cnn"),
    ("examples.models:nothing", {}, r"module 'examples.models' has no 'nothing' \(model.name="),
    ("nowhere.models:net", {}, r"cannot import module 'nowhere.models' for model.name='nowhere.models:net'"),
    ("digits_cn", {}, r"unknown model 'digits_cn' \(did you mean 'digits_cnn'\?\)"),
])
def test_bad_models_are_one_clear_error_before_anything_is_built(name, kwargs, message):
  with pytest.raises(ConfigError, match=message):
    rules.check(config_with(name, **kwargs))


def test_a_dict_without_logits_and_a_non_model_are_refused():
  inputs = keras.Input((4,))
  no_logits = keras.Model(inputs, {"scores": keras.layers.Dense(3)(inputs)})
  with pytest.raises(ConfigError, match=r"returned a dict without 'logits' \(keys: \['scores'\]\)"):
    classification.forward(no_logits, tf.zeros([1, 4]), training=False)


def test_sync_batchnorm_reaches_every_batchnorm_layer_nested_ones_too():
  inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.BatchNormalization()])
  inputs = keras.Input((4,))
  model = keras.Model(inputs, keras.layers.BatchNormalization()(inner(inputs)))
  assert model_lib.synchronize_batchnorm(model) == 2
  assert all(l.synchronized for l in private_apis.all_layers(model) if isinstance(l, keras.layers.BatchNormalization))
