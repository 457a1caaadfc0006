"""The batch-size finder: the largest per-replica batch whose train steps fit the device (GPU: no
ResourceExhaustedError) or, on CPU, a memory budget (CPUs swap or get killed instead of failing cleanly). Each size
is a throw-away run built as training builds it (loops/finders/trial.py); loops/core/batch_search.py decides
which sizes to try (doubling, then a binary search)."""

import contextlib
import ctypes
import dataclasses
import gc
import os
import posixpath
import threading
import time

from absl import logging
import keras
import tensorflow as tf

import data
from errors import ConfigError, first_line
from loops.core import batch_search
from loops.distribute import strategy as strategy_lib
from loops.finders import trial
from loops.persist import writers

OUT = "batch_size_find"
GB = 1024 ** 3


@dataclasses.dataclass
class Trial:
  per_replica_batch: int
  global_batch: int
  fits: bool
  memory_gb: float  # CPU: peak resident-memory growth of the process; GPU: peak device memory of GPU:0
  images_per_second: float  # 0 when it did not fit
  note: str = ""
  step_mb: float = 0.0  # TensorFlow's allocator: a train call's peak less what was in use (memory_mb.step_added_mb)


class PeakResidentMemory:
  """Samples this process's resident memory (Linux /proc/self/statm) every few milliseconds in a thread; `growth`
  is the peak minus the value when sampling started."""

  def __init__(self, interval=0.002):
    self.interval, self.start, self.peak = interval, 0, 0
    self._stop, self._thread = threading.Event(), None

  @staticmethod
  def now():
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * _PAGE_SIZE

  def __enter__(self):
    self.start = self.peak = self.now()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()
    return self

  def _sample(self):
    while not self._stop.wait(self.interval):
      self.peak = max(self.peak, self.now())

  def __exit__(self, *unused):
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, self.now())

  @property
  def growth(self):
    return self.peak - self.start


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _release_freed_memory():
  """Hands memory freed by earlier trials back to the OS (glibc's malloc_trim), so the next trial's growth is
  measured from a low baseline; a no-op where there is no glibc."""
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def measure(config, role, per_replica, replicas, timed_steps, budget_gb, on_gpu):
  """One size: builds a fresh run at per_replica x replicas, one untimed step (compiles), then timed_steps steps
  in one call; returns the Trial."""
  global_batch = per_replica * replicas
  run_config = trial.throwaway_config(config, 1 + timed_steps, global_batch_size=global_batch)
  gc.collect()
  _release_freed_memory()
  if on_gpu:
    tf.config.experimental.reset_memory_stats("GPU:0")
  try:
    with PeakResidentMemory() as resident:
      parts, execution = trial.start(run_config, role)
      execution.train(1)
      started = time.perf_counter()
      execution.train(timed_steps)
      seconds = time.perf_counter() - started
      step_memory = getattr(execution, "step_memory", None)  # SyncExecution: the allocator's peak in the steps
      step_mb = step_memory.values().get("memory/step_added_mb", 0.0) if step_memory else 0.0
  except tf.errors.ResourceExhaustedError as e:
    return Trial(per_replica, global_batch, False, 0.0, 0.0, note=f"out of memory: {first_line(e)[:80]}")
  finally:
    parts = execution = None  # free the trial's model, optimizer and input before the next size
    keras.backend.clear_session()
    gc.collect()
  memory = (tf.config.experimental.get_memory_info("GPU:0")["peak"] if on_gpu else resident.growth) / GB
  fits = not budget_gb or memory <= budget_gb
  note = "" if fits else f"over the budget of {budget_gb:g} GB"
  return Trial(per_replica, global_batch, fits, memory, timed_steps * global_batch / seconds, note, step_mb)


def find_batch_size(config, f, run, cluster, data_settings, workdir):
  """The search for config's run (checked by loops/finders/rules.py); writes workdir/batch_size_find; returns a dict.
  f, run, cluster, data_settings: the find, run, cluster and data settings; config: the bag its throw-away runs
  copy."""
  on_gpu = trial.replicas_on_gpu(run)  # the replicas' devices, not the machine's
  role = trial.role_of(config, workdir)
  out = trial.output_dir(workdir, OUT)
  replicas = strategy_lib.build(run, cluster, role).num_replicas_in_sync
  train_size = data.load(data_settings).train_size
  maximum = min(f.max_per_replica_batch, train_size // replicas)  # at least one step per epoch
  maximum -= maximum % f.granularity
  if maximum < f.granularity:
    raise ConfigError(f"find.granularity={f.granularity} x {replicas} replicas exceeds the {train_size} train "
                      "examples; lower find.granularity")
  trials = []

  def fits(per_replica):
    result = measure(config, role, per_replica, replicas, f.timed_steps, f.memory_budget_gb, on_gpu)
    logging.info("batch %d per replica: %s", per_replica, result)
    print(_row(result), flush=True)
    trials.append(result)
    return result.fits

  print(f"{'per replica':>11} {'global':>7} {'fits':>5} {'memory GB':>10} {'step MB':>8} {'images/s':>9}  "
        + ("(peak GPU:0 memory)" if on_gpu else f"(peak resident-memory growth; budget {f.memory_budget_gb:g} GB)"))
  with _quiet_build_logs():
    # one untimed, unrecorded run first: TensorFlow's one-time costs (kernels, tracing machinery) are not a batch's
    measure(config, role, f.granularity, replicas, 1, None, on_gpu)
    search = batch_search.largest_fitting(fits, start=f.granularity, maximum=maximum, granularity=f.granularity)
  result = {"largest_per_replica_batch": search.largest, "replicas": replicas,
            "global_batch_size": search.largest * replicas, "first_failure": search.first_failure,
            "maximum_tried": maximum, "memory_budget_gb": f.memory_budget_gb, "device": "GPU" if on_gpu else "CPU",
            "trials": [dataclasses.asdict(t) for t in trials], "output": out}
  if role.is_chief:
    writers.for_role(out, True).write_json("batch_size_find.json", result)
  _print(result, maximum)
  return result


@contextlib.contextmanager
def _quiet_build_logs():
  """Each size builds a run, whose config and plan log lines would repeat once per size: warnings only inside."""
  verbosity, tf_level = logging.get_verbosity(), tf.get_logger().level
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel("ERROR")  # a new compiled step per size: TensorFlow's retracing warning is expected
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)
    tf.get_logger().setLevel(tf_level)


def _row(t):
  return (f"{t.per_replica_batch:>11} {t.global_batch:>7} {'yes' if t.fits else 'no':>5} {t.memory_gb:>10.3f} "
          f"{t.step_mb:>8.1f} {t.images_per_second:>9.0f}  {t.note}")


def _print(result, maximum):
  if not result["largest_per_replica_batch"]:
    raise ConfigError(f"no batch fits: even {result['trials'][-1]['per_replica_batch']} per replica failed "
                      f"({result['trials'][-1]['note']}); lower find.granularity or raise find.memory_budget_gb")
  limit = (f"first failure at {result['first_failure']}" if result["first_failure"]
           else f"the search's maximum fitted: {maximum}, by find.max_per_replica_batch or one epoch of the "
                "train split")
  print(f"largest per-replica batch that fits: {result['largest_per_replica_batch']} ({limit}; "
        f"{result['replicas']} replica(s)); results in {posixpath.join(result['output'], 'batch_size_find.json')}")
  print(f"  --config.train.global_batch_size={result['global_batch_size']}")
