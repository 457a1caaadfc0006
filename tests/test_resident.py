"""data/resident.py: device-resident train input gives the host pipeline's batches exactly (any start step, 1 or
2 replicas and workers, flips, mixup/cutmix, resize, normalisation), trains bit-identically, resumes exactly, and falls back with a reason."""

import numpy as np
import pytest
import tensorflow as tf

import data
from configs import settings
from data import resident
from loops import run
from loops.distribute import strategy as strategy_lib
from tests.conftest import load_config


def digits_config(**data_overrides):
  c = load_config("digits_cnn")
  c.data.random_flip = True
  c.data.image_size = 12  # resized: the resident split is resized once, the host pipeline per batch
  c.data.mean, c.data.std = (0.3,), (0.2,)
  for key, value in data_overrides.items():
    c.data[key] = value
  return c


def resident_batches(strategy, source, config, global_batch, steps_per_epoch, steps):
  """(images, labels) of the global batch of each step, gathered on the replicas and concatenated in order."""
  on_devices = resident.ResidentTrainData(strategy, source, config.data, global_batch_size=global_batch,
                                          steps_per_epoch=steps_per_epoch, seed=config.seed)

  @tf.function
  def batch_of(step):
    block = strategy.run(on_devices.replica_block, args=(on_devices.call_indices(step, 1), step))
    return strategy.run(on_devices.step_batch, args=(block, 0))

  batches = []
  for step in steps:
    images, labels = batch_of(tf.constant(step, tf.int64))
    batches.append((np.concatenate([x.numpy() for x in strategy.experimental_local_results(images)]),
                    np.concatenate([y.numpy() for y in strategy.experimental_local_results(labels)])))
  return batches


MIXES = {"mixup_alpha": 0.4, "cutmix_alpha": 1.0}


@pytest.mark.e2e
@pytest.mark.parametrize("strategy_name, start, mixes", [("one_device", 0, {}), ("mirrored", 15, {}),
                                                        ("mirrored", 15, MIXES), ("one_device", 3, MIXES)])
def test_resident_batches_equal_the_host_pipelines_batch_for_batch(strategy_name, start, mixes):
  config = digits_config(**mixes)
  config.strategy, config.cpu_replicas = strategy_name, 2 if strategy_name == "mirrored" else 0
  strategy = _strategy(config)
  source = data.load(config.data)
  global_batch, steps_per_epoch = 64, source.train_size // 64
  steps = range(start, start + steps_per_epoch + 5)  # crosses an epoch boundary
  host = data.train_dataset(source, config.data, batch_size=global_batch, steps_per_epoch=steps_per_epoch,
                            seed=config.seed, start_step=start)
  for step, (host_batch, (images, labels)) in zip(steps, zip(host, resident_batches(
      strategy, source, config, global_batch, steps_per_epoch, steps))):
    np.testing.assert_array_equal(labels, host_batch[1].numpy(), err_msg=f"labels of step {step}")
    np.testing.assert_array_equal(images, host_batch[0].numpy(), err_msg=f"images of step {step}")
  assert images.shape == (64, 12, 12, 1)
  assert labels.shape == ((64, 10) if mixes else (64,))  # mixed: soft labels


def _strategy(config):
  """strategy.build given the run and cluster settings of `config`, for this process alone."""
  read = settings.read(config)
  return strategy_lib.build(read.run, read.cluster, role=_local_role())


def _local_role():
  from loops.distribute import cluster
  return cluster.ClusterRole()


def short_run(tmp_path, name, steps, **overrides):
  c = digits_config(**overrides)
  c.strategy, c.cpu_replicas = "mirrored", 2
  c.deterministic = True
  c.train.steps, c.train.steps_per_loop = steps, 5
  c.eval.every_steps, c.checkpoint.every_steps, c.export = 0, 10, False
  return run.train_and_evaluate(c, str(tmp_path / name)), str(tmp_path / name)


def final_weights(workdir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(f"{workdir}/checkpoints"))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_dtype_map()
          if "OBJECT_GRAPH" not in n and "save_counter" not in n}


@pytest.mark.e2e
def test_resident_training_is_bit_identical_to_the_host_pipeline_and_resumes_exactly(tmp_path, caplog):
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.INFO)
  host, host_dir = short_run(tmp_path, "host", 30, device_resident="off")
  assert "train input: host pipeline (data.device_resident=off)" in caplog.text
  on_devices, resident_dir = short_run(tmp_path, "resident", 30, device_resident="on")
  assert "train input: device-resident (the train split" in caplog.text
  assert on_devices["train/loss"] == host["train/loss"]
  short_run(tmp_path, "resumed", 20, device_resident="on")
  resumed, resumed_dir = short_run(tmp_path, "resumed", 30, device_resident="on")
  host_weights = final_weights(host_dir)
  assert len(host_weights) >= 10  # weights, optimizer slots, step
  for name, value in host_weights.items():
    np.testing.assert_array_equal(final_weights(resident_dir)[name], value, err_msg=name)
    np.testing.assert_array_equal(final_weights(resumed_dir)[name], value, err_msg=name)


@pytest.mark.e2e
def test_calls_read_in_several_blocks_with_mixes_train_bit_identically_to_the_host_pipeline(tmp_path, monkeypatch):
  # 32 rows per replica of 12x12x1 float32, twice (the rows and their mix partners): 2 steps per block, so the
  # calls of 5 steps read blocks of 2, 2 and 1 steps.
  monkeypatch.setattr(resident, "BLOCK_MAX_BYTES", 2 * (2 * 32 * 12 * 12 * 4))
  config = digits_config(**MIXES)
  config.strategy, config.cpu_replicas = "mirrored", 2
  source = data.load(config.data)
  on_devices = resident.ResidentTrainData(_strategy(config), source, config.data,
                                          global_batch_size=64, steps_per_epoch=22, seed=config.seed)
  assert on_devices.steps_per_block == 2
  host, host_dir = short_run(tmp_path, "host", 30, device_resident="off", **MIXES)
  resident_run, resident_dir = short_run(tmp_path, "resident", 30, device_resident="on", **MIXES)
  assert resident_run["train/loss"] == host["train/loss"]
  for name, value in final_weights(host_dir).items():
    np.testing.assert_array_equal(final_weights(resident_dir)[name], value, err_msg=name)


@pytest.mark.parametrize("overrides, synchronous, reason", [
    ({"device_resident": "off"}, True, "data.device_resident=off"),
    ({"device_resident_max_bytes": 1000}, True,
     r"the train split \(0.8 MiB\) is larger than data.device_resident_max_bytes \(0.0 MiB\)"),
    ({}, False, "parameter-server workers read their own datasets"),
])
def test_a_run_that_cannot_be_resident_falls_back_with_its_reason(overrides, synchronous, reason):
  config = digits_config(**overrides)
  decision = resident.decide(data.load(config.data), config.data, synchronous=synchronous)
  assert not decision.resident and decision.bytes_per_device == 0
  assert __import__("re").fullmatch(reason, decision.reason), decision.reason


def test_resident_bytes_count_the_preprocessed_float32_split():
  config = digits_config()
  source = data.load(config.data)
  decision = resident.decide(source, config.data, synchronous=True)
  assert decision.resident
  assert decision.bytes_per_device == source.train_size * (12 * 12 * 1 * 4) + source.train_size * 8  # int64 labels


def test_dry_run_reports_residency_and_bytes(tmp_path, capsys):
  config = digits_config()
  report = run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)
  expected = data.load(config.data).train_size * (12 * 12 * 4 + 8)
  block = 50 * 64 * 12 * 12 * 4  # a call of 50 steps of 64 float32 12x12x1 images, gathered at once
  assert report["device_resident"].startswith(f"yes, {expected} bytes per device + {block} bytes for a call's "
                                              f"gathered batches (the train split (0.8 MiB) fits")
  config.data.device_resident_max_bytes = 1000
  report = run.train_and_evaluate(config, str(tmp_path / "w"), dry_run=True)
  assert report["device_resident"].startswith("no: host pipeline (the train split (0.8 MiB) is larger than")
  assert not (tmp_path / "w").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("mixes", [{}, MIXES], ids=["flips", "flips+mixup+cutmix"])
def test_two_mwms_workers_train_bit_identically_resident_or_not(tmp_path, mixes):
  """Each worker gathers its shard (w::W of the epoch's permutation) with its host pipeline's flips and mixes
  (partners drawn from the other worker's rows too)."""
  import os
  import subprocess
  import sys
  from tests.conftest import REPO
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  args = ["--config=configs/digits_cnn.py", "--config.deterministic=True", "--config.train.steps=30",
          "--config.train.steps_per_loop=5", "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0",
          "--config.data.random_flip=True", "--config.summary.progress_bar=off", "--config.export=False",
          "--config.strategy=multi_worker_mirrored", *(f"--config.data.{k}={v}" for k, v in mixes.items())]
  outputs = {}
  for mode in ("off", "on"):
    result = subprocess.run([sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
                             *args, f"--workdir={tmp_path / mode}", f"--config.data.device_resident={mode}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:]
    outputs[mode] = result.stdout
  assert "[worker:1] " in outputs["on"] and "train input: device-resident" in outputs["on"]
  host, on_devices = final_weights(tmp_path / "off"), final_weights(tmp_path / "on")
  assert len(host) >= 10 and sorted(host) == sorted(on_devices)
  for name, value in host.items():
    np.testing.assert_array_equal(on_devices[name], value, err_msg=name)


def test_one_call_spanning_several_epochs_takes_each_steps_rows_of_its_own_epoch():
  config = digits_config()
  source = data.load(config.data)
  strategy = _strategy(config)
  steps_per_epoch = source.train_size // 64  # 22: a call of 50 steps from step 15 touches epochs 0, 1, 2 and 3
  on_devices = resident.ResidentTrainData(strategy, source, config.data, global_batch_size=64,
                                          steps_per_epoch=steps_per_epoch, seed=config.seed)
  rows = tf.function(on_devices.call_indices)(tf.constant(15, tf.int64), tf.constant(50)).numpy()
  assert rows.shape == (50, 1, 64)  # one worker: one group per step, the global batch
  rows = rows[:, 0]
  host = data.train_dataset(source, config.data, batch_size=64, steps_per_epoch=steps_per_epoch, seed=config.seed,
                            start_step=15)
  for i, (_, labels) in zip(range(50), host):
    np.testing.assert_array_equal(source.train_arrays[1][rows[i]], labels.numpy(), err_msg=f"step {15 + i}")
  assert len(set(rows[7 - 0].tolist()) & set(rows[7 + 22].tolist())) < 64  # steps 22 and 44: different epochs
