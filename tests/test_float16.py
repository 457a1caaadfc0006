"""float16 with dynamic loss scaling (Keras 3's LossScaleOptimizer, wrapped by loops/modeling/optimizers.build): digits
trains to >= 0.95, and a step whose gradients overflow float16 is skipped while the loss scale halves."""

import numpy as np
import pytest
import tensorflow as tf

from configs import settings
from loops import build as build_lib
from loops import run
from loops.distribute import execution as execution_lib
from loops.modeling import model as model_lib
from tests.conftest import load_config, set_keys


def float16_digits(precision="float16", **keys):
  c = load_config("digits_cnn")
  c.mixed_precision = precision
  c.model.name = "tests.fixtures.float16_models:one_conv"  # digits_cnn's float16 filter gradient: 1.2 s a step on CPU
  c.optimizer.name, c.optimizer.learning_rate = "adam", 0.003
  c.train.epochs, c.train.steps, c.train.steps_per_loop = None, 100, 50
  c.eval.every_steps = c.checkpoint.every_steps = 0
  return set_keys(c, keys)


@pytest.mark.e2e
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_mixed_precision_trains_digits(precision, tmp_path, caplog):
  summary = run.train_and_evaluate(float16_digits(precision), str(tmp_path))
  assert summary["eval/accuracy"] >= 0.95  # measured after 100 steps: float16 0.964, bfloat16 0.964
  emulated = not tf.config.list_physical_devices("GPU") and model_lib.emulated_on_cpu(precision, model_lib.cpu_flags())
  warnings = [r.getMessage() for r in caplog.records if "without GPU" in r.getMessage()]
  assert len(warnings) == emulated, warnings
  for warning in warnings:  # one line: this precision is emulated on this CPU, slower than float32
    assert warning.startswith(f"mixed_precision='{precision}' on a machine without GPU: ")
    assert "slower than float32" in warning and warning.endswith("; use it here to check a GPU config")


def test_a_precision_is_emulated_on_a_cpu_without_its_units(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 f16c\n\nprocessor\t: 1\nflags\t\t: fpu avx2 "
                     "amx_bf16\n")
  flags = model_lib.cpu_flags(str(cpuinfo))
  assert {"avx2", "f16c", "amx_bf16"} <= flags
  assert model_lib.emulated_on_cpu("float16", flags) and not model_lib.emulated_on_cpu("bfloat16", flags)
  assert not model_lib.emulated_on_cpu(None, flags)
  assert model_lib.emulated_on_cpu("bfloat16", model_lib.cpu_flags(str(tmp_path / "missing")))
  # float16's convolution gradient is slow on every CPU (AVX512_FP16 and AMX too: loops/modeling/model.py)
  assert model_lib.emulated_on_cpu("float16", {"avx512_fp16", "amx_fp16", "amx_bf16", "avx512_bf16"})
  import keras
  assert keras.mixed_precision.dtype_policy().name == "float32"  # the global policy was restored


@pytest.mark.e2e
@pytest.mark.parametrize("strategy, replicas, last_replica_only", [
    ("one_device", 0, False), ("mirrored", 2, False), ("mirrored", 2, True)])
def test_an_overflowing_step_is_skipped_and_the_loss_scale_halves(strategy, replicas, last_replica_only):
  """On 2 replicas whose second alone overflows, both skip the step as one device does (Keras 3 alone would let
  replica 0's finite gradients decide and apply the other's inf)."""
  config = float16_digits(**{"strategy": strategy, "cpu_replicas": replicas, "train.steps": 6,
                             "loss.name": "tests.fixtures.split_sensitive_tasks:overflows_at_step", "loss.kwargs.at_step": 3,
                             "loss.kwargs.last_replica_only": last_replica_only})
  from loops.finders import trial
  parts = build_lib.build(config, trial.role_of(config))
  read = settings.read(config)
  execution = execution_lib.make(parts, read.run, read.preemption)
  optimizer = parts.main_optimizer
  assert type(optimizer).__name__ == "LossScaleOptimizer"
  weights = lambda: [v.numpy().copy() for v in parts.main_model.trainable_variables]
  record = []
  for _ in range(5):
    before = weights()
    scale_before = float(optimizer.dynamic_scale.numpy())
    output = execution.train(1)
    record.append((before, weights(), scale_before, float(optimizer.dynamic_scale.numpy()), output))
  for step, (before, after, scale_before, scale_after, output) in enumerate(record):
    changed = any(not np.array_equal(a, b) for a, b in zip(before, after))
    if step == 3:  # skipped: no weight moved, the scale halved, the step still counted
      assert not changed and scale_after == scale_before / 2
      assert output.results["train/loss"] > 1e29 and output.step == 4
    else:
      assert changed and scale_after == scale_before, step
  assert record[0][2] == 2.0 ** 15  # Keras' initial scale
  assert int(optimizer.inner_optimizer.iterations.numpy()) == 4  # updates applied: 5 steps minus the skipped one


@pytest.mark.parametrize("precision, task, expected", [
    ("bfloat16", "contrastive", {"model": {"bfloat16"}, "projection": {"bfloat16"}, "probe": {"bfloat16"}}),
    ("float16", "regression", {"model": {"float16"}})])  # float16 scales one optimizer's loss
def test_every_model_a_task_builds_itself_computes_in_the_runs_precision(precision, task, expected):
  """Not only the registry's (ctx.model()): a task's own keras.Sequential too (it stayed float32, unsaid)."""
  from loops.finders import trial
  config = set_keys(load_config("tasks", task), {"mixed_precision": precision})
  parts = build_lib.build(config, trial.role_of(config))
  computes = {name: {layer.compute_dtype for layer in model.layers} for name, model in parts.models.items()}
  assert computes == expected, computes
  assert all(v.dtype == tf.float32 for m in parts.models.values() for v in m.variables)  # float32 weights
  import keras
  assert keras.mixed_precision.dtype_policy().name == "float32"  # the global policy was restored


def test_a_bfloat16_output_beside_float32_targets_is_one_line_saying_to_cast_it():
  from errors import ConfigError
  from loops.finders import trial
  config = set_keys(load_config("tasks", "regression"), {
      "mixed_precision": "bfloat16", "task.name": "tests.fixtures.float16_models:UncastOutput"})
  with pytest.raises(ConfigError, match=r"^UncastOutput.eval_step failed on a zero batch of 2 .*bfloat16.*; under "
                                        r"mixed_precision the models compute in bfloat16: cast a model's outputs to "
                                        r"your targets' dtype before mixing them \(tf.cast\(model\(x\), "
                                        r"targets.dtype\); docs/tasks.md\)$"):
    build_lib.build(config, trial.role_of(config))
