import math
import types

import pytest

from errors import ConfigError
from loops import rules
from loops import plan as plan_lib
from tests.conftest import load_config


def test_per_replica_batch_and_steps_derive_from_the_final_global_batch():
  c = load_config("digits_cnn")
  c.train.global_batch_size = 128  # as a command-line override would
  p = plan_lib.derive(c.train, c.optimizer, replicas=2, train_size=1437)
  assert (p.global_batch_size, p.per_replica_batch_size, p.steps_per_epoch) == (128, 64, 11)
  assert p.total_steps == math.ceil(c.train.epochs * 11)


def test_per_replica_batch_size_scales_with_replicas_unless_global_is_set():
  c = load_config("resnet50_mirrored")
  assert plan_lib.derive(c.train, c.optimizer, replicas=4, train_size=50_000).global_batch_size == 1024
  c.train.global_batch_size = 512
  assert plan_lib.derive(c.train, c.optimizer, replicas=4, train_size=50_000).per_replica_batch_size == 128


def test_steps_override_epochs():
  c = load_config("digits_cnn")
  c.train.steps = 7
  assert plan_lib.derive(c.train, c.optimizer, replicas=1, train_size=1437).total_steps == 7


@pytest.mark.parametrize("rule, expected", [
    ("none", 0.1), ("linear_replicas", 0.4), ("linear_batch_256", 0.1 * 512 / 256), ("sqrt_replicas", 0.2)])
def test_learning_rate_scaling_rules(rule, expected):
  c = load_config("digits_cnn")
  c.optimizer.learning_rate, c.optimizer.lr_scaling, c.train.global_batch_size = 0.1, rule, 512
  derived = plan_lib.derive(c.train, c.optimizer, replicas=4, train_size=10_000)
  assert derived.learning_rate == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.train, "global_batch_size", 63), "global batch size 63 is not divisible by the 2 replicas"),
    (lambda c: setattr(c.train, "global_batch_size", 4096), "fewer than one global batch of 4096"),
    (lambda c: setattr(c.train, "grad_accum_steps", 3), "train.grad_accum_steps=3 must be a positive integer "
                                                        "dividing the per-replica batch"),
])
def test_what_only_the_replicas_and_data_reveal_is_one_clear_error(change, message):
  c = load_config("digits_cnn")
  change(c)
  digits = types.SimpleNamespace(name="digits", train_size=1437, image_shape=(8, 8, 1), train_files=None)
  with pytest.raises(ConfigError, match=message):
    rules.check_derived(c, plan_lib.derive(c.train, c.optimizer, replicas=2, train_size=1437), digits)


def test_xla_is_refused_with_synchronized_batchnorm_on_several_replicas_only():
  import keras
  from loops.modeling import model as model_lib
  c = load_config("digits_cnn")
  c.jit_compile, c.model.sync_batchnorm = True, True
  plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  normed = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), keras.layers.BatchNormalization(name="bn")])
  for model in (plain, normed):
    model_lib.configure_batchnorm(model, c.model)
  rules.check_compiled_batchnorm(c, 2, "model", plain)  # sync_batchnorm without a BatchNorm: nothing to compile
  rules.check_compiled_batchnorm(c, 1, "model", normed)  # one replica: no cross-replica mean
  with pytest.raises(ConfigError, match=r"^jit_compile=True with model.sync_batchnorm on 2 replicas: .* synchronized "
                                        r"BatchNorm of model 'model' \(bn, ...\) .*; turn one off$"):
    rules.check_compiled_batchnorm(c, 2, "model", normed)
