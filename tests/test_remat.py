"""model.remat (loops/modeling/remat.py): layers and blocks recomputed in the backward pass train what they train
without it (BatchNorm's moving statistics updated once, keyed Dropout's mask the same), they are recomputed, bad
settings are one line, and a train call's memory is in summary.json."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import rules as rules_lib
from loops import replica_check
from loops.modeling import remat
from tests.conftest import load_config, run_main, set_keys

RESIDUAL = "tests.test_remat:residual_with_dropout"
CALLS = {"n": 0}


class Counted(keras.layers.Layer):
  """Doubles its input; counts how often its call is traced (a recomputation traces it again)."""

  def call(self, x):
    CALLS["n"] += 1
    return x * 2.0


def residual_with_dropout(input_shape, num_classes, rate=0.5):
  """Two residual blocks of conv -> BatchNorm -> ReLU -> Dropout -> conv, one input, one output."""
  inputs = keras.Input(input_shape)
  x = keras.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
  for i in range(2):
    # no bias before BatchNorm: its true gradient is 0, and its rounding-sized updates differ by O(1) between any
    # two orders of summation (XLA fuses a recomputed step otherwise: measured 0.8-1.3 relative)
    y = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name=f"b{i}_conv1")(x)
    y = keras.layers.ReLU(name=f"b{i}_relu")(keras.layers.BatchNormalization(name=f"b{i}_bn")(y))
    y = keras.layers.Dropout(rate, name=f"b{i}_dropout")(y)
    y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{i}_conv2")(y)
    x = keras.layers.Add(name=f"b{i}_add")([x, y])
  x = keras.layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float32", name="logits")(x))


def residual_config(**overrides):
  config = load_config("digits_cnn")
  return set_keys(config, {"model.name": RESIDUAL, "strategy": "mirrored", "cpu_replicas": 2,
                           "train.global_batch_size": 16, "model.sync_batchnorm": True, **overrides})


def relative_differences(a, b):
  """{variable path: |a - b| / |a|} of the final values of two trained_values results (every model and optimizer
  variable: weights, BatchNorm's moving statistics, momentum)."""
  return {path: float(np.linalg.norm(b[key][1] - final) / max(np.linalg.norm(final), 1e-12))
          for key, (_, final, path) in a.items()}


CASES = {
    "full": {"model.remat": "full"},
    "larger_than": {"model.remat": "larger_than", "model.remat_output_size": 256},
    "list_of_layers": {"model.remat": "list_of_layers", "model.remat_layers": ["b?_bn", "b0_dropout", "b1_*"]},
    "blocks": {"model.remat": "blocks"},
    "blocks, unfused BatchNorm": {"model.remat": "blocks", "model.fused_batchnorm": False},
    "blocks, float16": {"model.remat": "blocks", "mixed_precision": "float16"},
    # XLA with synchronized BatchNorm on 2 replicas fails without remat too (merge_call inside the jit-compiled
    # gradient function): unsynchronized here
    "full, XLA": {"model.remat": "full", "jit_compile": True, "model.sync_batchnorm": False},
    "blocks, XLA": {"model.remat": "blocks", "jit_compile": True, "model.sync_batchnorm": False},
    "blocks, accumulation": {"model.remat": "blocks", "train.grad_accum_steps": 2},
}


KEPT = {}  # the run without remat of each set of other settings, trained once for the cases that share it


def kept_values(overrides):
  key = tuple(sorted(overrides.items()))
  if key not in KEPT:
    KEPT[key] = replica_check.trained_values(residual_config(**overrides), 3)
  return KEPT[key]


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(CASES))
def test_recomputed_steps_train_what_kept_activations_train(name):
  """3 steps on 2 replicas with Dropout(0.5) and synchronized BatchNorm: every weight, moving statistic and
  momentum as without remat (a second moving-average update or another Dropout mask would move them by 1e-3 to
  1e-1: measured when the recomputation ran outside keras.StatelessScope)."""
  overrides = {k: v for k, v in CASES[name].items() if not k.startswith("model.remat")}
  kept = kept_values(overrides)
  recomputed = replica_check.trained_values(residual_config(**CASES[name]), 3)
  tolerance = 1e-2 if "float16" in name else 1e-5
  moved = {path: d for path, d in relative_differences(kept, recomputed).items() if d > tolerance}
  assert not moved, moved
  assert any("moving_mean" in path for _, _, path in kept.values())


def counted_model(mode):
  """stem conv -> Counted -> BatchNorm -> Add(stem) -> logits, built in the RematScope of `mode` (with
  model.remat_layers ["count*"] and a size threshold below Counted's output)."""
  model_config = load_config("digits_cnn").model
  with model_config.unlocked():
    model_config.update({"remat": mode, "remat_layers": ["count*"], "remat_output_size": 100})
  with remat.scope(model_config):
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    y = keras.layers.BatchNormalization()(Counted(name="counted")(x))
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(keras.layers.Add()([x, y])))
    model = keras.Model(inputs, outputs)
  if mode == "blocks":
    remat.recompute_blocks(model)
  elif mode:
    remat.install(model)
  return model


@pytest.mark.parametrize("mode,calls", [("", 1), ("list_of_layers", 2), ("larger_than", 4), ("blocks", 2),
                                        ("full", 3)])
def test_each_mode_recomputes_the_layers_it_marks(mode, calls):
  """Calls of Counted in one traced training step: the forward pass, then each recomputation ("full" recomputes
  the whole model and, inside it, each layer: 3; "larger_than" adds Keras' two traces for the output size, the
  model's and the layer's: 4)."""
  model = counted_model(mode)

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(x, training=True))
    return tape.gradient(loss, model.trainable_variables)

  CALLS["n"] = 0
  step(tf.ones([2, 6, 6, 3]))
  assert CALLS["n"] == calls


def test_keras_own_recomputation_fails_inside_a_tf_function_which_is_why_it_is_replaced():
  """Keras 3.15 on TensorFlow: tf.recompute_grad refuses the `training` keyword inside a tf.function. When this
  test fails, Keras' own mechanism may have become usable: reconsider remat.install."""
  model_config = load_config("digits_cnn").model
  with model_config.unlocked():
    model_config.remat = "full"
  with remat.scope(model_config):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
  with pytest.raises(ValueError, match="custom_gradient decorator currently supports keywords arguments only"):
    tf.function(lambda x: model(x, training=True))(tf.ones([1, 4]))


@pytest.mark.parametrize("overrides,message", [
    ({"model.remat": "every"}, r"^unknown model.remat 'every'"),
    ({"model.remat": "list_of_layers"}, r"^model.remat='list_of_layers' needs model.remat_layers: "),
    ({"model.remat": "larger_than", "model.remat_output_size": 0},
     r"^model.remat_output_size must be a number of values per example >= 1, got 0$"),
    ({"model.remat_layers": [3]}, r"^model.remat_layers must be layer names or fnmatch patterns \(strings\)"),
])
def test_a_bad_remat_setting_is_one_line(overrides, message):
  with pytest.raises(ConfigError, match=message) as raised:
    rules_lib.check(set_keys(load_config("digits_cnn"), overrides))
  assert "\n" not in str(raised.value)


@pytest.mark.parametrize("task,mode,message", [
    ("TwoInputsWithBatchNorm", "blocks", r"^model.remat='blocks' needs a functional model with one input and one "
                                         r"output; 'two_inputs' is not one: use 'full'"),
    ("WithUnkeyedNoise", "full", r"^model.remat on model 'model': .*random_translation.* draw\(s\) from Keras' "
                                 r"seed state, which a recomputation would advance"),
])
def test_a_model_remat_cannot_serve_is_refused_in_one_line(task, mode, message):
  config = set_keys(load_config("tasks", "regression"), {
      "task.name": f"tests.fixtures.split_sensitive_tasks:{task}", "model.remat": mode})
  with pytest.raises(ConfigError, match=message) as raised:
    replica_check.Side(config)
  assert "\n" not in str(raised.value)


@pytest.mark.e2e
def test_blocks_keep_less_of_a_step_in_memory_and_the_summary_says_so(tmp_path):
  """ResNet-20 on 32x32 synthetic images, batch 32, 2 steps: the allocator's peak above what a call began with is
  at least 30 % lower with blocks recomputed (measured: 236 -> 112 MB at batch 128)."""
  added = {}
  for mode in ("", "blocks"):
    workdir = tmp_path / (mode or "off")
    done = run_main("--config=configs/cifar_resnet20.py:synthetic", f"--config.model.remat={mode}",
                    "--config.train.steps=2", "--config.train.global_batch_size=32", "--config.export=False",
                    f"--workdir={workdir}")
    assert done.returncode == 0, done.stderr[-2000:]
    memory = json.loads((workdir / "summary.json").read_text())["memory_mb"]
    assert 0 < memory["step_added_mb"] <= memory["step_peak_mb"], memory
    added[mode] = memory["step_added_mb"]
  assert added["blocks"] < 0.7 * added[""], added
