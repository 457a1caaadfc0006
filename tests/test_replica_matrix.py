"""The replica matrix: every option that touches the step, each on its own and in the combinations users run, through
the replica check (1 vs 2 replicas from the same weights, `main.py --check=replicas`): N replicas compute what one
computes. One row per case; a row that fails is a framework bug (fixed, or the option refused with one line).

The example tasks' rows are here too (distillation, which needs a trained teacher, is in tests/test_tasks.py).
A row of each family also goes through 2 worker processes against one device (`main.py --check=workers`).
"""

import pytest

from errors import ConfigError

from loops import replica_check
from loops import worker_check
from tests.conftest import load_config, run_main, set_keys

TASKS = "tests.fixtures.split_sensitive_tasks:"
DIGITS = ("digits_cnn", None)
# BatchNorm in every block: ResNet-8 (one block per stage: an identity block, then two projection blocks) has every
# kind of block ResNet-20 has, at a third of the layers to trace (tests/test_check_table.py checks the shipped
# ResNet-20, -m slow)
RESNET = ("digits_cnn", None, {"model.name": "cifar_resnet20", "model.kwargs.blocks_per_stage": 1})
TASK = ("tasks", "regression")
# float16 on CPU: one conv (digits_cnn's second conv's float16 filter gradient is Eigen's fallback, ~0.5 s a call)
FLOAT16 = {"mixed_precision": "float16", "model.name": "tests.fixtures.float16_models:one_conv"}

MATRIX = {
    # optimizers with clipping, weight decay, EMA and schedules
    "sgd, global_clipnorm": (*DIGITS, {"optimizer.global_clipnorm": 0.01}),
    "sgd nesterov, weight decay, piecewise": (*DIGITS, {
        "optimizer.nesterov": True, "optimizer.weight_decay": 5e-4, "optimizer.schedule": "piecewise",
        "optimizer.decay_epochs": (0.05,)}),
    "adam, global_clipnorm, weight decay": (*DIGITS, {
        "optimizer.name": "adam", "optimizer.learning_rate": 1e-3, "optimizer.global_clipnorm": 0.1,
        "optimizer.weight_decay": 1e-4}),
    "adamw, EMA, cosine with warmup": (*DIGITS, {
        "optimizer.name": "adamw", "optimizer.learning_rate": 1e-3, "optimizer.ema_decay": 0.9,
        "optimizer.schedule": "cosine", "optimizer.warmup_epochs": 0.05}),
    "task: ctx.optimizer(global_clipnorm=...)": (*TASK, {"task.name": TASKS + "ClipsThroughItsOptimizer"}),
    "task: keras SGD(clipnorm=...)": (*TASK, {"task.name": TASKS + "KerasOptimizerClipsByValue"}),
    "task: keras SGD(clipvalue=...)": (*TASK, {"task.name": TASKS + "KerasOptimizerClipsByEachValue"}),
    "task: transform_gradients clips and logs": (*TASK, {"task.name": TASKS + "ClipsAndLogsItsGradients"}),
    "task: transform_gradients, float16, accumulation": (*TASK, {
        "task.name": TASKS + "ClipsAndLogsItsGradients", **FLOAT16, "train.grad_accum_steps": 2}),
    # losses
    "label smoothing": (*DIGITS, {"loss.label_smoothing": 0.1}),
    "focal": (*DIGITS, {"loss.name": "focal"}),
    "multiclass hinge": (*DIGITS, {"loss.name": "multiclass_hinge"}),
    "a user's loss (outputs, step)": (*DIGITS, {
        "model.name": "examples.models:cnn_with_embedding", "model.kwargs.reconstruct": True,
        "loss.name": "examples.losses:reconstruction_auxiliary"}),
    # data
    "mixup": (*DIGITS, {"data.mixup_alpha": 0.2}),
    "cutmix": (*DIGITS, {"data.cutmix_alpha": 1.0}),
    "mixup + cutmix, random flip": (*DIGITS, {"data.mixup_alpha": 0.2, "data.cutmix_alpha": 1.0,
                                              "data.random_flip": True}),
    "host input pipeline": (*DIGITS, {"data.device_resident": "off"}),
    "device-resident input": (*DIGITS, {"data.device_resident": "on"}),
    # the step
    "gradient accumulation": (*DIGITS, {"train.grad_accum_steps": 2}),
    "gradient accumulation, clipping": (*DIGITS, {"train.grad_accum_steps": 2, "optimizer.global_clipnorm": 0.01}),
    "float16": (*DIGITS, FLOAT16),
    "bfloat16": (*DIGITS, {"mixed_precision": "bfloat16"}),
    "float16, clipping": (*DIGITS, {**FLOAT16, "optimizer.global_clipnorm": 0.01}),
    "float16, one replica's gradients overflow": (*DIGITS, {
        **FLOAT16, "loss.name": TASKS + "overflows_at_step", "loss.kwargs.at_step": 1,
        "loss.kwargs.last_replica_only": True}),
    "XLA": (*DIGITS, {"jit_compile": True}),
    # BatchNorm
    "sync BatchNorm": (*RESNET[:2], {**RESNET[2], "model.sync_batchnorm": True}),
    "sync BatchNorm, unfused": (*RESNET[:2], {**RESNET[2], "model.sync_batchnorm": True,
                                              "model.fused_batchnorm": False}),
    # rematerialization (model.remat): recomputed blocks and layers, BatchNorm synchronized, keyed Dropout
    "remat blocks, sync BatchNorm": (*RESNET[:2], {**RESNET[2], "model.sync_batchnorm": True, "model.remat": "blocks"}),
    "task model with BatchNorm and Dropout, sync, remat full": (*TASK, {
        "task.name": TASKS + "WithDropout", "model.sync_batchnorm": True, "model.remat": "full"}),
    # task models
    "task model with BatchNorm, sync": (*TASK, {"task.name": TASKS + "TwoInputsWithBatchNorm",
                                                "model.sync_batchnorm": True}),
    "task model with BatchNorm and Dropout, sync": (*TASK, {"task.name": TASKS + "WithDropout",
                                                            "model.sync_batchnorm": True}),
    "task model with Dropout, accumulation": (*TASK, {"task.name": TASKS + "WithDropout",
                                                      "model.sync_batchnorm": True, "train.grad_accum_steps": 2}),
    # the example tasks (loops/task)
    "example: regression": ("tasks", "regression", {}),
    "example: gan": ("tasks", "gan", {}),
    "example: sam": ("tasks", "sam", {}),
    "example: contrastive": ("tasks", "contrastive", {}),
    "example: segmentation": ("tasks", "segmentation", {}),
    "example: wgan_gp (update_every, 5 steps)": ("tasks", "wgan_gp", {}),
    # sequences of different lengths, an Embedding's sparse gradients under Adam (made dense)
    "example: sequence, padded per replica": ("tasks", "sequence", {}),
    "example: sequence, bucketed global batches": ("tasks", "sequence",
                                                   {"data.name": "examples.tasks.sequence:bucketed_batches"}),
    "example: fixmatch (two input streams, every pseudo-label)": ("tasks", "fixmatch", {"task.kwargs.threshold": 0.0}),
    "built-in classification": (*DIGITS, {}),
}


# rows run as a user runs them, `main.py --check=replicas` (exit code 0, the verdict last on stdout), the flags giving
# the row's config (tests/test_streams.py's command-line check of fixmatch is this row)
COMMAND_LINE = {"example: fixmatch (two input streams, every pseudo-label)": (
    "--config=configs/tasks.py:fixmatch", "--config.task.kwargs.threshold=0.0")}


def case_config(name):
  config_name, arg, overrides = MATRIX[name]
  config = load_config(config_name, arg)
  config.train.global_batch_size = 32 if config_name == "digits_cnn" else config.train.global_batch_size
  return set_keys(config, overrides)


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(MATRIX))
def test_two_replicas_compute_what_one_does(name):
  lines = []
  if name in COMMAND_LINE:
    result = run_main(*COMMAND_LINE[name], "--check=replicas")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("replicas: PASS: "), result.stdout[-2000:]
  else:
    assert replica_check.run(case_config(name), out=lines.append), "\n".join(lines)
  assert lines[-1].startswith("replicas: PASS: 1 and 2 replicas agree on all "), lines[-1]
  if "update_every" in name:  # every variant ran: the generator's update is at step 4
    assert "at each of 5 steps" in lines[-1], lines[-1]


# one row per family, each on a pair of worker processes of its own: optimizer and clipping, data mixing,
# accumulation, a float16 step that one worker's overflow must make every worker skip, a task's model with
# BatchNorm and keyed Dropout (also recomputed: model.remat), a step-level task updating a model every k steps, a task's own transform of the
# summed gradients, a task reading several input streams (each strided over workers)
ACROSS_WORKERS = ("sgd, global_clipnorm", "mixup + cutmix, random flip", "gradient accumulation, clipping",
                  "float16, one replica's gradients overflow",
                  "task model with BatchNorm and Dropout, sync",
                  "task model with BatchNorm and Dropout, sync, remat full", "example: wgan_gp (update_every, 5 steps)",
                  "task: transform_gradients clips and logs",
                  "example: fixmatch (two input streams, every pseudo-label)")


NAN_ON_WORKER_1 = "loss NaN on worker 1's rows"  # a FAIL whose cause the check must name


@pytest.fixture(scope="module")
def across_workers():
  """{row: (passed, report lines)} of ACROSS_WORKERS and NAN_ON_WORKER_1, each on 2 worker processes of its own."""
  configs = [case_config(name) for name in ACROSS_WORKERS]
  configs.append(set_keys(load_config("digits_cnn"), {"train.global_batch_size": 32,
                                                      "loss.name": TASKS + "nan_on_the_last_of_several_replicas"}))
  return dict(zip((*ACROSS_WORKERS, NAN_ON_WORKER_1), worker_check.compare(configs, timeout_seconds=240)))


@pytest.mark.e2e
@pytest.mark.parametrize("name", ACROSS_WORKERS)
def test_two_workers_compute_what_one_device_does(name, across_workers):
  passed, lines = across_workers[name]
  assert passed, "\n".join(lines)
  assert lines[-1].startswith("workers: PASS: 1 device and 2 workers agree on all "), lines[-1]


@pytest.mark.e2e
def test_a_fail_from_nan_on_one_worker_names_it_not_the_users_reduction(across_workers):
  passed, lines = across_workers[NAN_ON_WORKER_1]
  assert not passed and lines[-1].startswith("workers: FAIL: "), lines[-1]
  assert replica_check.REDUCTION not in lines[-1], lines[-1]
  assert ": cause: the variables hold inf or NaN on 2 workers where they are finite on 1 device (" in lines[-1], (
      lines[-1])


def test_synchronized_batchnorm_under_accumulation_on_several_workers_is_refused_in_one_line():
  """Workers read strided shards, so their micro-batches' statistics cannot be one device's: refused, not run."""
  config = case_config("task model with Dropout, accumulation")
  with pytest.raises(ConfigError, match=r"^model.sync_batchnorm with train.grad_accum_steps=2 on 2 workers: "):
    worker_check.compare([config])
