"""Values derived from the final config (after command-line overrides), never stored in it.

`validate` checks what needs no TensorFlow; `derive` computes batch sizes, lengths and the learning rate
from the config, the replica count and the dataset size.
"""

import dataclasses
import math

from loops import optimizers
from loops.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Plan:
  replicas: int
  global_batch_size: int
  per_replica_batch_size: int
  steps_per_epoch: int
  total_steps: int
  steps_per_loop: int
  eval_every_steps: int  # 0 = only at the end
  checkpoint_every_steps: int  # 0 = only at the end
  learning_rate: float  # peak lr, after optimizer.lr_scaling
  grad_accum_steps: int = 1

  @property
  def epochs(self):
    return self.total_steps / self.steps_per_epoch


def validate(config):
  """Eager checks of settings that must hold whatever the strategy and data."""
  loop = config.train.steps_per_loop
  if not isinstance(loop, int) or loop < 1:
    raise ConfigError(f"train.steps_per_loop must be a positive integer, got {loop!r}")
  for key, value in (("eval.every_steps", config.eval.every_steps),
                     ("checkpoint.every_steps", config.checkpoint.every_steps),
                     ("summary.histogram_every_steps", config.summary.histogram_every_steps)):
    if value < 0 or value % loop:
      raise ConfigError(f"{key}={value} must be 0 (only at the end) or a multiple of "
                        f"train.steps_per_loop={loop}")
  if config.nan_policy.mode not in ("stop", "rollback") or config.nan_policy.max_retries < 0:
    raise ConfigError(f"nan_policy.mode must be 'stop' or 'rollback' and max_retries >= 0, got "
                      f"{config.nan_policy.mode!r}, {config.nan_policy.max_retries}")
  if config.nan_policy.mode == "rollback" and config.strategy == "parameter_server":
    raise ConfigError("nan_policy.mode='rollback' is not available with parameter_server (its per-worker "
                      "datasets cannot be rewound); use 'stop'")
  if config.checkpoint.keep < 1:
    raise ConfigError(f"checkpoint.keep must be >= 1, got {config.checkpoint.keep}")
  if config.train.steps is not None and config.train.steps < 1:
    raise ConfigError(f"train.steps must be >= 1 (or None to use train.epochs), got {config.train.steps}")
  if config.train.steps is None and not (config.train.epochs or 0) > 0:
    raise ConfigError(f"set train.steps or train.epochs (> 0); got steps=None, epochs={config.train.epochs}")


def derive(config, replicas, train_size, num_input_pipelines=1):
  """Returns the Plan; raises ConfigError when the batch cannot be split evenly."""
  validate(config)
  train = config.train
  if train.global_batch_size is not None:
    global_batch = train.global_batch_size
  elif train.per_replica_batch_size is not None:
    global_batch = train.per_replica_batch_size * replicas
  else:
    raise ConfigError("set train.global_batch_size (or train.per_replica_batch_size)")
  if global_batch < 1:
    raise ConfigError(f"the global batch size must be >= 1, got {global_batch}")
  for parts, what in ((replicas, "replicas"), (num_input_pipelines, "input pipelines")):
    if global_batch % parts:
      raise ConfigError(f"global batch size {global_batch} is not divisible by the {parts} {what}; "
                        f"use a multiple of {parts}")
  accum = train.grad_accum_steps
  if not isinstance(accum, int) or accum < 1 or (global_batch // replicas) % accum:
    raise ConfigError(f"train.grad_accum_steps={accum} must be a positive integer dividing the per-replica batch "
                      f"({global_batch // replicas})")
  steps_per_epoch = train_size // global_batch
  if steps_per_epoch < 1:
    raise ConfigError(f"the training set has {train_size} examples, fewer than one global batch of {global_batch}")
  total = train.steps if train.steps is not None else math.ceil(train.epochs * steps_per_epoch)
  return Plan(
      replicas=replicas,
      global_batch_size=global_batch,
      per_replica_batch_size=global_batch // replicas,
      steps_per_epoch=steps_per_epoch,
      total_steps=int(total),
      steps_per_loop=train.steps_per_loop,
      eval_every_steps=config.eval.every_steps,
      checkpoint_every_steps=config.checkpoint.every_steps,
      learning_rate=optimizers.scaled_learning_rate(config.optimizer, global_batch, replicas),
      grad_accum_steps=accum)
