"""Strategy by name. The only module that knows strategy names and device lists."""

import itertools

from absl import logging
import tensorflow as tf

from loops.errors import ConfigError, unknown_name

STRATEGIES = ("one_device", "mirrored", "central_storage")
PLANNED = ("multi_worker_mirrored", "parameter_server", "tpu")  # not built yet: a clear error, never a fallback.

# Every MirroredStrategy starts its collective group keys at the class's `_collective_key_base`. Two strategies
# in one process (tests, notebooks, benchmarks) would otherwise reuse keys and fail with "Shape mismatch in the
# collective instance" once their models differ. TensorFlow's own tests set the same attribute.
_COLLECTIVE_KEY_BASES = itertools.count(start=0, step=10_000)


def configure_devices(config):
  """Sets GPU memory growth and `cpu_replicas` logical CPUs. Must run before TensorFlow initialises."""
  for gpu in tf.config.list_physical_devices("GPU"):
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # runtime already up: memory growth was set (or not) by an earlier run.
      pass
  wanted = int(config.cpu_replicas)
  if wanted < 0:
    raise ConfigError(f"cpu_replicas must be >= 0 (0 = off), got {wanted}")
  if wanted == 0:
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  current = tf.config.get_logical_device_configuration(cpu)
  if current is not None and len(current) >= wanted:
    return
  try:
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
  except RuntimeError:
    have = len(tf.config.list_logical_devices("CPU"))
    raise ConfigError(f"cpu_replicas={wanted} must be set before TensorFlow starts; this process already runs "
                      f"with {have} logical CPU(s)") from None


def replica_devices(config):
  """Devices that hold one replica each, for single-machine strategies."""
  if config.cpu_replicas > 0:
    return [f"/cpu:{i}" for i in range(config.cpu_replicas)]
  gpus = tf.config.list_logical_devices("GPU")
  if config.num_gpus is not None:
    if not 0 <= config.num_gpus <= len(gpus):
      raise ConfigError(f"num_gpus={config.num_gpus} but this machine has {len(gpus)} GPU(s); "
                        f"valid: 0..{len(gpus)} or None (all)")
    gpus = gpus[:config.num_gpus]
  if gpus:
    return [g.name for g in gpus]
  return ["/cpu:0"]


def build(config):
  """Returns the tf.distribute.Strategy named by config.strategy."""
  name = config.strategy
  if name in PLANNED:
    raise ConfigError(f"strategy '{name}' is not built yet in this framework; available now: {', '.join(STRATEGIES)}")
  if name not in STRATEGIES:
    raise unknown_name("strategy", name, STRATEGIES + PLANNED)
  devices = replica_devices(config)
  if name == "one_device":
    strategy = tf.distribute.OneDeviceStrategy(devices[0])
  elif name == "mirrored":
    if devices == ["/cpu:0"]:
      logging.warning("mirrored: no GPU and cpu_replicas=0, so one CPU replica; set cpu_replicas=N for N replicas")
    tf.distribute.MirroredStrategy._collective_key_base = next(_COLLECTIVE_KEY_BASES)
    strategy = tf.distribute.MirroredStrategy(devices)
  else:  # central_storage: variables on the CPU, compute on each device.
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=devices, parameter_device="/cpu:0")
  logging.info("strategy %s with %d replica(s) on %s", name, strategy.num_replicas_in_sync, ", ".join(devices))
  return strategy
