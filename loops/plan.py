"""Values derived from the final config (after command-line overrides), never stored in it.

`derive` computes batch sizes, lengths and the learning rate from the config (already checked by
loops/check.py), the replica count and the dataset size, and rejects what only these reveal.
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


def derive(config, replicas, train_size, num_input_pipelines=1):
  """Returns the Plan; raises ConfigError when the batch cannot be split evenly."""
  train = config.train
  if train.global_batch_size is not None:
    global_batch = train.global_batch_size
  elif train.per_replica_batch_size is not None:
    global_batch = train.per_replica_batch_size * replicas
  else:
    raise ConfigError("set train.global_batch_size (or train.per_replica_batch_size)")
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
