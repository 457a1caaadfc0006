"""cluster.bytes_per_pack: multi_worker_mirrored all-reduces the gradients in packs (last layers first), computing
exactly what one all-reduce computes."""

import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils

from loops.distribute import strategy as strategy_lib
from tests.conftest import REPO, run_command
from tests.test_train import model_weights

SIZES = [288, 32, 18432, 64, 131072, 128, 1280, 10]  # digits_cnn's variables, in elements


@pytest.mark.parametrize("bytes_per_pack", [0, 1, 4096, 100_000, 10**9])
def test_the_pack_arithmetic_is_tensorflows(bytes_per_pack):
  tensors = [tf.zeros([n]) for n in reversed(SIZES)]  # tf.distribute reverses the gradients before grouping
  expected = [sum(int(t.shape[0]) * 4 for t in pack)
              for pack in cross_device_utils.group_by_size(tensors, bytes_per_pack)]
  assert strategy_lib.gradient_packs([n * 4 for n in SIZES], bytes_per_pack) == expected


def test_packs_start_with_the_last_layers_and_close_once_over_the_size():
  assert strategy_lib.gradient_packs([100, 10, 1000, 5], 0) == [1115]
  assert strategy_lib.gradient_packs([100, 10, 1000, 5], 50) == [1005, 110]


def two_worker_run(workdir, bytes_per_pack):
  """2-worker digits run (deterministic, 4 steps) with TensorFlow's own log: (its output, the checkpointed weights)."""
  command = [sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
             "--config=configs/digits_cnn.py", f"--workdir={workdir}", "--config.strategy=multi_worker_mirrored",
             "--config.train.steps=4", "--config.train.steps_per_loop=2", "--config.deterministic=True",
             "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0", "--config.export=False",
             "--config.summary.progress_bar=off", f"--config.cluster.bytes_per_pack={bytes_per_pack}", "--debug"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  done = run_command(command, env=env, timeout=500)
  assert done.returncode == 0, done.stdout[-3000:]
  return done.stdout, model_weights(str(workdir))


@pytest.mark.e2e
def test_two_workers_with_packs_train_bit_identically_to_one_all_reduce(tmp_path):
  one_output, one_pack = two_worker_run(tmp_path / "one", 0)
  packed_output, packed = two_worker_run(tmp_path / "packed", 4096)
  packs = {int(n) for n in re.findall(r"Collective all_reduce tensors: 8 all_reduces.*num_packs = (\d+)",
                                      packed_output)}
  assert packs == {len(strategy_lib.gradient_packs([n * 4 for n in SIZES], 4096))} == {4}, packs
  assert set(re.findall(r"Collective all_reduce tensors: 8 all_reduces.*num_packs = (\d+)", one_output)) == {"1"}
  assert one_pack.keys() == packed.keys()
  for key, value in one_pack.items():
    np.testing.assert_array_equal(packed[key], value, err_msg=key)
  assert any("_trainable_variables" in key and np.abs(value).sum() > 0 for key, value in one_pack.items())
