"""A throw-away run: the config's strategy, data, loss, model and optimizer built as training builds them
(check -> devices -> role -> build -> execution), with a fresh model, one step per call, no eval, no checkpoint
object ever saved, and nothing written to the workdir."""

import posixpath

import tensorflow as tf

from configs import settings as settings_lib
from errors import ConfigError
from loops import build as build_lib
from loops import rules as rules_lib
from loops.distribute import execution as execution_lib
from loops.distribute import startup
from loops.distribute import strategy as strategy_lib


def has_gpu():
  return bool(tf.config.list_physical_devices("GPU"))


def replicas_on_gpu(run):
  """Whether the run's replicas are GPUs (strategy.replica_devices), not merely whether the machine has one:
  cpu_replicas > 0 or num_gpus=0 train on CPU (`run`: the run settings). Reads physical devices only (the runtime
  is not started yet)."""
  return run.cpu_replicas == 0 and run.num_gpus != 0 and has_gpu()


def throwaway_config(config, steps, global_batch_size=None):
  """A copy of config for `steps` train steps: constant lr without warmup or weight averaging (the finder sets
  its own learning rate), no eval or checkpoint cadence; global_batch_size replaces the batch when given."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.train.steps, c.train.epochs, c.train.steps_per_loop = steps, None, 1
    if global_batch_size is not None:
      c.train.global_batch_size, c.train.per_replica_batch_size = global_batch_size, None
    c.optimizer.schedule, c.optimizer.warmup_epochs, c.optimizer.ema_decay = "constant", 0.0, 0.0
    c.eval.every_steps = c.checkpoint.every_steps = 0
  return c


def role_of(config, workdir=None):
  """This process's cluster.ClusterRole, checked against the strategy (after the devices are configured); `workdir` holds
  the address exchange of ranks started by an MPI launcher, as in a run."""
  rules_lib.check(config)
  settings = settings_lib.read(config)
  strategy_lib.configure_devices(settings.run)
  role = build_lib.cluster_role(settings.cluster, workdir)
  rules_lib.check_role(config, role)
  if role.is_distributed:
    startup.check_port_free(role)
  return role


def start(config, role):
  """(parts, execution) of a fresh run of `config` (the model is newly initialised: nothing is restored)."""
  settings = settings_lib.read(config)  # the throw-away run's settings, read once as a run reads them
  parts = build_lib.build_from(settings, config, role)
  return parts, execution_lib.make(parts, settings.run, settings.preemption)


def output_dir(workdir, name):
  """workdir/name, the finder's own directory; refused when it holds checkpoints (the finders never write or
  overwrite one)."""
  out = posixpath.join(workdir, name)
  if tf.io.gfile.exists(posixpath.join(out, "checkpoints")) or tf.io.gfile.exists(posixpath.join(out, "checkpoint")):
    raise ConfigError(f"{out} holds checkpoints: it is a training workdir, not a finder's output; remove it or "
                      "choose another --workdir")
  return out


def clear_events(out):
  """Removes the TensorBoard event files of an earlier search in the finder's own directory (a rerun's curve
  would be drawn over the old one)."""
  for path in tf.io.gfile.glob(posixpath.join(out, "events.out.tfevents.*")):
    tf.io.gfile.remove(path)
