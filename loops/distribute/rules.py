"""The rules of where a run executes: strategy, devices, cluster settings (`check_settings`, before anything is
built) and the strategy against this process's cluster role and the machine (`check_role`)."""

from errors import ConfigError, at_least, one_of
from loops.distribute import cluster
from loops.distribute import parameter_server
from loops.distribute import strategy as strategy_lib


def check_settings(config):
  """strategy, replicas and threads, num_gpus, cluster.* on their own, and what a strategy cannot do."""
  one_of("strategy", config.strategy, strategy_lib.STRATEGIES)
  for key in ("cpu_replicas", "intra_op_threads", "inter_op_threads"):
    at_least(key, config[key], 0)
  if config.num_gpus is not None:
    at_least("num_gpus", config.num_gpus, 0, "None (all) or an integer")
  one_of("cluster.source", config.cluster.source, cluster.SOURCES)
  port = config.cluster.k8s_port
  if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
    raise ConfigError(f"cluster.k8s_port must be a port number in 1..65535, got {port!r}")
  one_of("cluster.collective", config.cluster.collective, strategy_lib.COLLECTIVES)
  at_least("cluster.bytes_per_pack", config.cluster.bytes_per_pack, 0, "a number of bytes (0 = one pack)")
  timeout = config.cluster.collective_timeout_seconds
  if timeout is not None and not timeout > 0:
    raise ConfigError(f"cluster.collective_timeout_seconds must be > 0 or None (wait forever), got {timeout}")
  if not config.cluster.startup_timeout_seconds > 0:
    raise ConfigError(f"cluster.startup_timeout_seconds must be > 0, got {config.cluster.startup_timeout_seconds}")
  if config.strategy in strategy_lib.MULTI_WORKER and config.cpu_replicas:
    raise ConfigError("cpu_replicas applies to one machine (mirrored, central_storage); with "
                      "multi_worker_mirrored each worker has one CPU replica or all its GPUs")
  if config.nan_policy.mode == "rollback" and not strategy_lib.can_rewind_input(config.strategy):
    raise ConfigError(f"nan_policy.mode='rollback' is not available with {config.strategy} (its per-worker "
                      "datasets cannot be rewound); use 'stop'")


def check_role(config, role):
  """The strategy against this process's task (loops/distribute/cluster.py) and the machine's devices.

  Args:
    config: the checked config.
    role: this process's cluster.ClusterRole.

  Raises:
    ConfigError: a strategy the cluster cannot run, or more GPUs asked for than the machine has.
  """
  name = config.strategy
  if role.is_evaluator:
    pass  # an evaluator evaluates on its own devices, whatever the training cluster runs
  elif name in strategy_lib.MULTI_WORKER and not role.is_distributed and role.alone:
    raise ConfigError(f"strategy 'multi_worker_mirrored' needs 2 or more workers, and this process found {role.alone}: "
                      "start 2 or more (completions and parallelism of the Job, -np of the launcher), or train on one "
                      "machine with strategy=mirrored")
  elif name in strategy_lib.MULTI_WORKER and not role.is_distributed:
    raise ConfigError("strategy 'multi_worker_mirrored' needs a cluster: set TF_CONFIG, run under srun, or start "
                      "it with `python -m launch.local --workers N -- python main.py ...`")
  elif name in strategy_lib.ASYNCHRONOUS:
    parameter_server.check_cluster(role)
  elif name not in strategy_lib.MULTI_WORKER and name != "tpu" and role.is_distributed and role.num_workers > 1:
    raise ConfigError(f"strategy '{name}' runs on one machine, but this process is {role.type}:{role.index} "
                      f"of a {role.num_workers}-worker cluster; use multi_worker_mirrored (or unset TF_CONFIG)")
  if config.strategy in strategy_lib.MULTI_WORKER:
    check_micro_batches_across_workers(config, role.num_workers)
  gpus = strategy_lib.gpu_count()
  if config.num_gpus is not None and not config.num_gpus <= gpus:
    raise ConfigError(f"num_gpus={config.num_gpus} but this machine has {gpus} GPU(s); valid: 0..{gpus} or None (all)")
  replicas = config.cpu_replicas or (gpus if config.num_gpus is None else config.num_gpus)
  if name == "central_storage" and config.mixed_precision == "float16" and replicas > 1:
    raise ConfigError(f"mixed_precision='float16' under central_storage on {replicas} replicas: Keras 3's "
                      "LossScaleOptimizer cannot update its loss scale there (a variable on the CPU that no replica "
                      "may assign); use strategy=mirrored, or mixed_precision='bfloat16' (no loss scaling)")


def check_micro_batches_across_workers(config, num_workers):
  """Synchronized BatchNorm under gradient accumulation on several workers: refused. Micro-batch i of every
  replica is rows i, i + k, ... of its batch; within a worker they add up to one device's micro-batch i, but workers
  read strided shards of the global batch, so across workers the statistics would cover other examples than on
  one device (measured: the worker check fails, 0.73)."""
  if config.model.sync_batchnorm and config.train.grad_accum_steps > 1 and num_workers > 1:
    raise ConfigError(f"model.sync_batchnorm with train.grad_accum_steps={config.train.grad_accum_steps} on "
                      f"{num_workers} workers: each micro-batch's BatchNorm statistics would cover other "
                      "examples than on one device (workers read strided shards of the global batch); set "
                      "train.grad_accum_steps=1 or model.sync_batchnorm=False")
