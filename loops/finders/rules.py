"""The finders' rules (`--find=lr|batch_size`): their find.* settings and the strategy they run on."""

from errors import ConfigError, at_least, one_of
from loops.distribute import strategy as strategy_lib

FINDERS = ("lr", "batch_size")


def check_finder(config, what, has_gpu):
  """The find.* settings of one finder (loops/finders/) and the strategy it runs on.

  Raises:
    ConfigError: a bad bound, step count, factor or budget (one line), or a strategy the finder cannot use.
  """
  one_of("--find", what, FINDERS)
  f = config.find
  if config.strategy in strategy_lib.ASYNCHRONOUS:
    raise ConfigError(f"--find={what} needs a synchronous strategy (one_device, mirrored, multi_worker_mirrored, "
                      "central_storage), not parameter_server")
  if what == "lr":
    if not 0 < f.lr_min < f.lr_max:
      raise ConfigError(f"find.lr_min and find.lr_max must satisfy 0 < lr_min < lr_max, got {f.lr_min}, {f.lr_max}")
    at_least("find.lr_steps", f.lr_steps, 10)
    if not 0 <= f.smoothing < 1 or not f.diverge_factor > 1:
      raise ConfigError(f"find.smoothing must be in [0, 1) and find.diverge_factor > 1, got {f.smoothing} and "
                        f"{f.diverge_factor}")
    return
  if config.strategy in strategy_lib.MULTI_WORKER:
    raise ConfigError("--find=batch_size measures one machine: run it with strategy one_device or mirrored (the "
                      "per-replica batch that fits a device is the same under multi_worker_mirrored)")
  at_least("find.granularity", f.granularity, 1)
  at_least("find.max_per_replica_batch", f.max_per_replica_batch, f.granularity)
  at_least("find.timed_steps", f.timed_steps, 1)
  if not has_gpu and not (f.memory_budget_gb or 0) > 0:
    raise ConfigError("--find=batch_size on a machine without GPU needs a memory budget: CPUs do not fail cleanly "
                      f"when memory runs out; set --config.find.memory_budget_gb=GB (> 0), got {f.memory_budget_gb}")
