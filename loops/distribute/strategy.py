"""Strategy by name. The only module that knows strategy names and device lists."""

import itertools

from absl import logging
import tensorflow as tf

from errors import ConfigError
from loops import private_apis
from loops.distribute import parameter_server

STRATEGIES = ("one_device", "mirrored", "central_storage", "multi_worker_mirrored", "parameter_server", "tpu")
MULTI_WORKER = ("multi_worker_mirrored",)
ASYNCHRONOUS = ("parameter_server",)  # its per-worker datasets cannot be rewound (no NaN rollback)
COLLECTIVES = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}

# Every MirroredStrategy starts its collective group keys at the class's `_collective_key_base`. Two strategies
# in one process (tests, notebooks, benchmarks) would otherwise reuse keys and fail with "Shape mismatch in the
# collective instance" once their models differ. TensorFlow's own tests set the same attribute.
_COLLECTIVE_KEY_BASES = itertools.count(start=0, step=10_000)


def mirrored(devices):
  """A MirroredStrategy over `devices` whose collective keys no other strategy of this process uses."""
  private_apis.next_collective_keys(tf.distribute.MirroredStrategy, next(_COLLECTIVE_KEY_BASES))
  return tf.distribute.MirroredStrategy(devices)


def configure_devices(run):
  """Sets GPU memory growth, thread pools and `cpu_replicas` logical CPUs (`run`: the run settings, the top-level
  keys). Must run before TensorFlow initialises."""
  for key, setter, getter in (
      ("intra_op_threads", tf.config.threading.set_intra_op_parallelism_threads,
       tf.config.threading.get_intra_op_parallelism_threads),
      ("inter_op_threads", tf.config.threading.set_inter_op_parallelism_threads,
       tf.config.threading.get_inter_op_parallelism_threads)):
    threads = int(getattr(run, key))
    if threads and getter() != threads:
      try:
        setter(threads)
      except RuntimeError:
        raise ConfigError(f"{key}={threads} must be set before TensorFlow starts") from None
  for gpu in tf.config.list_physical_devices("GPU"):
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # runtime already up: memory growth was set (or not) by an earlier run.
      pass
  wanted = int(run.cpu_replicas)
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


def gpu_count():
  """GPUs of this machine, without starting TensorFlow's runtime (multi_worker_mirrored must be created first)."""
  return len(tf.config.list_physical_devices("GPU"))


def replica_devices(run):
  """Devices that hold one replica each, for single-machine strategies (`run`: the run settings)."""
  if run.cpu_replicas > 0:
    return [f"/cpu:{i}" for i in range(run.cpu_replicas)]
  gpus = tf.config.list_logical_devices("GPU")
  if run.num_gpus is not None:
    gpus = gpus[:run.num_gpus]
  if gpus:
    return [g.name for g in gpus]
  return ["/cpu:0"]


def build(run, cluster, role):
  """Returns the tf.distribute.Strategy named by the `strategy` setting for this process (checked by
  loops/rules.py); `run`, `cluster`: the run and cluster settings."""
  name = run.strategy
  if role.is_evaluator and (name in MULTI_WORKER or name == "parameter_server"):
    name = _evaluator_strategy(run, name)
  if name in MULTI_WORKER:
    return _multi_worker(cluster, role)
  if name == "parameter_server":
    return parameter_server.build_strategy(role)
  if name == "tpu":
    return _tpu(cluster)
  devices = replica_devices(run)
  if name == "one_device":
    strategy = tf.distribute.OneDeviceStrategy(devices[0])
  elif name == "mirrored":
    if devices == ["/cpu:0"]:
      logging.warning("mirrored: no GPU and cpu_replicas=0, so one CPU replica; set cpu_replicas=N for N replicas")
    strategy = mirrored(devices)
  else:  # central_storage: variables on the CPU, compute on each device.
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=devices, parameter_device="/cpu:0")
  logging.info("strategy %s with %d replica(s) on %s", name, strategy.num_replicas_in_sync, ", ".join(devices))
  return strategy


def _evaluator_strategy(run, training_name):
  """An evaluator process never joins the training cluster's collectives: it evaluates on its own devices."""
  name = "mirrored" if len(replica_devices(run)) > 1 else "one_device"
  logging.info("evaluator process: %s on this machine's devices (the training cluster runs %s)", name, training_name)
  return name


def _multi_worker(cluster, role):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(role.cluster), task_type=role.type, task_id=role.index, rpc_layer="grpc",
      num_accelerators={"GPU": len(tf.config.list_physical_devices("GPU"))})
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=COLLECTIVES[cluster.collective], bytes_per_pack=int(cluster.bytes_per_pack),
      timeout_seconds=cluster.collective_timeout_seconds)
  private_apis.next_collective_keys(tf.distribute.MultiWorkerMirroredStrategy, next(_COLLECTIVE_KEY_BASES))
  try:
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
  except RuntimeError as e:
    if "configured at program startup" not in str(e):
      raise
    raise ConfigError("multi_worker_mirrored must be created before TensorFlow runs anything, but it already ran: "
                      "usually a plug-in module (model, loss, metric or callback) that makes a tensor or variable "
                      "when it is imported; make them inside its functions") from None
  logging.info("strategy multi_worker_mirrored: process %s:%d of %d workers, %d replica(s) in sync, collective %s, "
               "bytes per pack %d", role.type, role.index, role.num_workers, strategy.num_replicas_in_sync,
               cluster.collective, cluster.bytes_per_pack)
  return strategy


def _tpu(cluster):
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cluster.tpu or None)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except Exception as e:  # ValueError (no TPU name), NotFoundError, ...: no TPU reachable.
    text = str(e).strip().splitlines()
    raise ConfigError(f"strategy 'tpu' found no TPU (cluster.tpu='{cluster.tpu}'): "
                      f"{text[0] if text else type(e).__name__}") from None
  return tf.distribute.TPUStrategy(resolver)


def gradient_packs(sizes, bytes_per_pack):
  """Bytes of each all-reduce pack for gradients of `sizes` bytes (in variable order), as multi_worker_mirrored
  groups them: the list reversed (the last layers' gradients are ready first), a new pack begun once the current
  one holds more than bytes_per_pack; 0 = one pack. Mirrors tf.distribute's cross_device_utils.group_by_size."""
  packs = []
  for size in reversed(list(sizes)):
    if not packs or (bytes_per_pack and packs[-1] > bytes_per_pack):
      packs.append(0)
    packs[-1] += size
  return packs


def can_rewind_input(name):
  return name not in ASYNCHRONOUS


def is_multi_worker(strategy):
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
