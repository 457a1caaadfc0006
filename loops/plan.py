"""Values derived from the final config (after command-line overrides), never stored in it.

`derive` computes batch sizes, lengths and the learning rate from the config, the replica count and the dataset
size; it checks nothing (loops/rules.py's check_derived judges the values, before anything is built on them).
"""

import dataclasses
import math

from loops.modeling import optimizers


@dataclasses.dataclass(frozen=True)
class Plan:
  replicas: int
  global_batch_size: int
  per_replica_batch_size: int
  steps_per_epoch: int
  total_steps: int
  steps_per_loop: int
  learning_rate: float  # peak lr, after optimizer.lr_scaling
  grad_accum_steps: int = 1
  input_pipelines: int = 1  # one per worker under multi_worker_mirrored

  @property
  def epochs(self):
    return self.total_steps / self.steps_per_epoch


def derive(train, optimizer, replicas, train_size, num_input_pipelines=1, epoch_steps=None, kept=None):
  """The Plan from the `train` and `optimizer` settings for `replicas` replicas and a train split of `train_size`
  examples (arithmetic only).

  epoch_steps: fn(global batch) -> steps per epoch, when the data decides it (record files: data/records.py);
  default train_size // global batch.
  kept: {'global_batch_size', 'learning_rate'} a resumed run keeps from its record (loops/resume.py), whatever
  the replica count now is.
  """
  if kept:
    global_batch = kept["global_batch_size"]
  elif train.global_batch_size is not None:
    global_batch = train.global_batch_size
  else:
    global_batch = train.per_replica_batch_size * replicas
  steps_per_epoch = epoch_steps(global_batch) if epoch_steps else train_size // global_batch
  total = train.steps if train.steps is not None else math.ceil(train.epochs * steps_per_epoch)
  return Plan(
      replicas=replicas,
      global_batch_size=global_batch,
      per_replica_batch_size=global_batch // replicas,
      steps_per_epoch=steps_per_epoch,
      total_steps=int(total),
      steps_per_loop=train.steps_per_loop,
      learning_rate=(kept["learning_rate"] if kept
                     else optimizers.scaled_learning_rate(optimizer, global_batch, replicas)),
      grad_accum_steps=train.grad_accum_steps,
      input_pipelines=num_input_pipelines)
