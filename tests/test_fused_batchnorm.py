"""loops/modeling/fused_batchnorm.py: the fused kernel computes what Keras' BatchNormalization computes, and only where it can."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from loops.modeling import fused_batchnorm
from loops.modeling import model as model_lib
from tests.conftest import load_config


def small_net(seed=0, policy=None):
  """conv -> BN -> relu -> BN without scale/center -> pool -> dense -> BN on 2-D features -> logits."""
  previous = keras.mixed_precision.dtype_policy()
  if policy:
    keras.mixed_precision.set_dtype_policy(policy)
  try:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization(momentum=0.9)(x))
    x = keras.layers.BatchNormalization(center=False, scale=False, epsilon=1e-5)(x)
    x = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(x))
    x = keras.layers.BatchNormalization(beta_initializer="ones", gamma_initializer="random_uniform")(x)
    return keras.Model(inputs, keras.layers.Dense(3, dtype="float32")(x))
  finally:
    keras.mixed_precision.set_dtype_policy(previous)


def train(model, steps=4):
  """SGD with momentum on fixed random batches; returns the training-mode outputs of each step."""
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)
  rng = np.random.default_rng(1)
  batches = [(rng.normal(2.0, 3.0, (16, 6, 6, 3)).astype("float32"), rng.integers(0, 3, 16)) for _ in range(steps)]

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return logits

  return [step(x, y).numpy() for x, y in batches]


def relative_difference(a, b):
  a = np.concatenate([np.ravel(w) for w in a])
  b = np.concatenate([np.ravel(w) for w in b])
  return np.linalg.norm(a - b) / np.linalg.norm(a)


def test_fused_training_equals_keras_batchnorm_outputs_weights_and_moving_statistics():
  keras_model, fused_model = small_net(), small_net()
  assert fused_batchnorm.fuse(fused_model) == 3
  keras_outputs, fused_outputs = train(keras_model), train(fused_model)
  for a, b in zip(keras_outputs, fused_outputs):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
  assert relative_difference(keras_model.get_weights(), fused_model.get_weights()) < 1e-5
  moving = [v.numpy() for v in keras_model.non_trainable_variables]
  assert relative_difference(moving, [v.numpy() for v in fused_model.non_trainable_variables]) < 1e-5
  assert not np.allclose(moving[1], 1.0)  # the moving variance did move (so the comparison above means something)
  probe = np.random.default_rng(2).normal(size=(4, 6, 6, 3)).astype("float32")
  np.testing.assert_allclose(fused_model(probe, training=False).numpy(), keras_model(probe, training=False).numpy(),
                             rtol=1e-4, atol=1e-5)


def test_a_frozen_layer_normalises_with_its_moving_statistics_as_keras_does():
  keras_model, fused_model = small_net(), small_net()
  fused_batchnorm.fuse(fused_model)
  for model in (keras_model, fused_model):
    for layer in model.layers:
      if isinstance(layer, keras.layers.BatchNormalization):
        layer.moving_mean.assign(np.linspace(-1, 1, layer.moving_mean.shape[0]))
        layer.trainable = False
  x = np.random.default_rng(3).normal(size=(8, 6, 6, 3)).astype("float32")
  before = [v.numpy() for v in fused_model.non_trainable_variables]
  np.testing.assert_allclose(fused_model(x, training=True).numpy(), keras_model(x, training=True).numpy(),
                             rtol=1e-4, atol=1e-5)
  for a, b in zip(before, fused_model.non_trainable_variables):
    np.testing.assert_array_equal(a, b.numpy())


def test_bfloat16_models_stay_in_bfloat16_and_agree_with_keras_to_its_precision():
  keras_model, fused_model = small_net(policy="mixed_bfloat16"), small_net(policy="mixed_bfloat16")
  fused_batchnorm.fuse(fused_model)
  x = np.random.default_rng(4).normal(size=(8, 6, 6, 3)).astype("float32")
  bn = fused_model.layers[2]
  assert bn(tf.cast(x[..., :1].repeat(8, -1), tf.bfloat16), training=True).dtype == tf.bfloat16
  np.testing.assert_allclose(fused_model(x, training=True).numpy(), keras_model(x, training=True).numpy(),
                             rtol=0.05, atol=0.05)


def op_types(layer, x, **kwargs):
  """The op types of `layer`'s call traced into a graph."""
  graph = tf.function(lambda t: layer(t, **kwargs)).get_concrete_function(tf.TensorSpec(x.shape)).graph
  return {op.type for op in graph.get_operations()}


def test_the_fused_kernel_runs_for_training_batches_only():
  layer = keras.layers.BatchNormalization()
  layer.build((None, 4, 4, 3))
  fused_batchnorm.fuse(keras.Sequential([keras.Input((4, 4, 3)), layer]))
  x = np.zeros((2, 4, 4, 3), "float32")
  assert "FusedBatchNormV3" in op_types(layer, x, training=True)
  assert "Mean" not in op_types(layer, x, training=True)  # Keras' moments are not computed beside it
  assert "FusedBatchNormV3" not in op_types(layer, x, training=False)
  layer.trainable = False
  assert "FusedBatchNormV3" not in op_types(layer, x, training=True)


class OwnCall(keras.layers.BatchNormalization):
  def call(self, inputs, training=None, mask=None):
    return super().call(inputs, training=training, mask=mask) * 2.0


class OwnMoments(keras.layers.BatchNormalization):
  def _moments(self, inputs, mask):
    mean, _ = super()._moments(inputs, mask)
    return mean, keras.ops.ones_like(mean)


@pytest.mark.parametrize("layer, reason", [
    (keras.layers.BatchNormalization(synchronized=True), "synchronized"),
    (keras.layers.BatchNormalization(renorm=True), "renorm"),
    (keras.layers.BatchNormalization(axis=1), "channels first"),
    (OwnCall(), "a subclass with its own call"),
    (OwnMoments(), "a subclass with its own statistics"),
])
def test_layers_the_kernel_does_not_reproduce_keep_keras_call(layer, reason):
  inputs = keras.Input((4, 4, 4))
  model = keras.Model(inputs, layer(inputs))
  assert fused_batchnorm.fuse(model) == 0, reason
  assert "call" not in vars(layer)


def test_a_masked_call_goes_through_keras_own_call():
  layer = keras.layers.BatchNormalization()
  layer.build((None, 5, 3))
  reference = keras.layers.BatchNormalization()
  reference.build((None, 5, 3))
  fused_batchnorm.fuse(keras.Sequential([keras.Input((5, 3)), layer]))
  assert "call" in vars(layer)
  x = np.random.default_rng(5).normal(size=(4, 5, 3)).astype("float32")
  mask = np.array([[1, 1, 1, 0, 0]] * 4, bool)
  np.testing.assert_array_equal(layer(x, training=True, mask=mask).numpy(),
                                reference(x, training=True, mask=mask).numpy())
  masked = tf.function(lambda t: layer(t, training=True, mask=mask)).get_concrete_function(tf.TensorSpec(x.shape))
  assert "FusedBatchNormV3" not in {op.type for op in masked.graph.get_operations()}
  np.testing.assert_allclose(layer(x, training=True).numpy(), reference(x, training=True).numpy(), atol=1e-5)


def test_the_run_fuses_unless_told_not_to_and_never_a_synchronized_layer():
  c = load_config("cifar_resnet20", "synthetic")
  model = model_lib.build_model(c.model, c.mixed_precision, (32, 32, 3), 10)
  batchnorms = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
  assert len(batchnorms) == 21 and all("call" in vars(l) for l in batchnorms)
  c.model.fused_batchnorm = False
  built = model_lib.build_model(c.model, c.mixed_precision, (32, 32, 3), 10)
  assert not any("call" in vars(l) for l in built.layers)
  c.model.fused_batchnorm, c.model.sync_batchnorm = True, True
  synced = model_lib.build_model(c.model, c.mixed_precision, (32, 32, 3), 10)
  assert not any("call" in vars(l) for l in synced.layers if isinstance(l, keras.layers.BatchNormalization))


def test_checkpoints_and_a_saved_model_are_keras_own(tmp_path):
  model = small_net()
  fused_batchnorm.fuse(model)
  train(model, steps=2)
  tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  plain = small_net(seed=9)
  tf.train.Checkpoint(model=plain).read(str(tmp_path / "ckpt")).assert_consumed()
  assert relative_difference(model.get_weights(), plain.get_weights()) == 0
  path = os.path.join(tmp_path, "model.keras")
  model.save(path)
  loaded = keras.models.load_model(path)
  assert [type(l).__name__ for l in loaded.layers].count("BatchNormalization") == 3
  assert not any("call" in vars(l) for l in loaded.layers)
  x = np.random.default_rng(6).normal(size=(4, 6, 6, 3)).astype("float32")
  np.testing.assert_allclose(loaded(x, training=False).numpy(), model(x, training=False).numpy(), rtol=1e-4,
                             atol=1e-5)


def test_a_batch_of_one_example_gives_keras_moving_variance_not_a_nan():
  layers = [keras.layers.BatchNormalization(momentum=0.5) for _ in range(2)]
  for layer in layers:
    layer.build((None, 5))
  fused_batchnorm.fuse(keras.Sequential([keras.Input((5,)), layers[1]]))
  x = np.arange(5, dtype="float32")[None]
  outputs = [layer(x, training=True).numpy() for layer in layers]
  np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-6)
  np.testing.assert_allclose(layers[1].moving_variance.numpy(), layers[0].moving_variance.numpy(), atol=1e-7)
  np.testing.assert_allclose(layers[1].moving_mean.numpy(), layers[0].moving_mean.numpy(), atol=1e-7)
  assert np.allclose(layers[1].moving_variance.numpy(), 0.5)  # 1 x momentum + 0 x (1 - momentum)
