"""Executions: how a run trains and evaluates under one strategy family. The only code that knows the family.

Both implement the `Execution` protocol of loops/core/interfaces.py (what the loop calls), plus
`preemption(checkpoints)`: the watcher that saves and exits when the cluster preempts the task.

SyncExecution: one_device, mirrored, central_storage, multi_worker_mirrored, tpu (every replica steps together).
ParameterServerExecution: the coordinator of parameter_server (workers step asynchronously).
"""

import contextlib
import itertools
import math
import re

from absl import logging
import keras
import numpy as np
import tensorflow as tf

import data
from data import resident as resident_lib
from data import service as data_service
from data import user_stream
from errors import ConfigError, WorkerLostError, first_line
from loops.core import stragglers
from loops.core.interfaces import TrainOutput
from loops.distribute import memory
from loops.distribute import parameter_server
from loops.distribute import service_watch
from loops.distribute import steps
from loops.distribute import strategy as strategy_lib
from loops import task as task_lib
from loops.modeling import optimizers
from loops.persist.preemption import PreemptionWatcher
from loops.task import update_every

STOP_REASON_BYTES = 256
# What a collective raises when a peer process is gone (connection reset, missed heartbeats) or too slow (timeout).
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                 tf.errors.CancelledError)


def serve_if_server(strategy, role):
  """Parameter-server worker and ps processes only serve (until stopped); returns True when this process did.
  strategy: the strategy's name (the strategy setting)."""
  if strategy in strategy_lib.ASYNCHRONOUS and role.type in ("worker", "ps"):
    parameter_server.serve(role)
    return True
  return False


def asynchronous(strategy):
  return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def input_pipelines(strategy, role):
  """Input pipelines the global batch is split over: one per worker under multi_worker_mirrored, else one."""
  return role.num_workers if strategy_lib.is_multi_worker(strategy) else 1


def train_metrics(task):
  """{name: keras.metrics.Mean}: train/loss and the task's own train scalars (Task.train_metrics)."""
  return {name: keras.metrics.Mean(name=name) for name in ("loss", *task.train_metrics)}


def metrics_scope(strategy):
  """Where metrics live: in the strategy (a copy per replica, summed when read), or outside it: on the
  parameter-server coordinator, and under central storage, whose one aggregated copy TensorFlow updates wrongly
  from several replicas (each replica's assign_add adds the old value again: 2^n - 1 times the sum after n
  updates, measured on TF 2.21), while a plain variable takes every replica's assign_add."""
  single_copy = isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
  return contextlib.nullcontext() if asynchronous(strategy) or single_copy else strategy.scope()


def lost_worker_error(strategy, error, step, checkpoint):
  """The one-line WorkerLostError for a peer failure in multi-worker training, or None (not a lost peer)."""
  return worker_lost(error, step, checkpoint) if strategy_lib.is_multi_worker(strategy) else None


def worker_lost(error, step, checkpoint):
  """WorkerLostError naming the peer (when the message does), the step, and what a rerun resumes from."""
  text = str(error)
  peer = re.search(r"(/job:\w+/(?:replica:\d+/)?task:\d+)\b(?!/device)", text)  # not this process's own devices
  lines = text.splitlines()
  at = next((n for n, line in enumerate(lines) if "aborted by" in line or "unhealthy" in line or "Deadline" in line),
            None)
  reason = re.sub(r"\{\{.*?\}\}\s*", "", lines[at] if at is not None else first_line(error)).strip()
  if at is not None and reason.endswith(":"):  # the tasks it announces follow, one a line
    listed = [line.strip() for line in itertools.takewhile(lambda l: re.fullmatch(r"\s*/job:\S+\s*", l),
                                                           lines[at + 1:])]
    reason = f"{reason} {', '.join(listed)}" if listed else reason
  return WorkerLostError(
      f"lost {'process ' + peer.group(1) if peer else 'another process'} during training near step {step} "
      f"({type(error).__name__}: {reason}); this process stops. Rerun the whole job to resume from "
      f"{checkpoint or 'the start (no checkpoint yet)'}")


def residency(parts):
  """data/resident.py's decision for this run (logged once by the caller that acts on it)."""
  return resident_lib.decide(parts.source, parts.data_settings, synchronous=not asynchronous(parts.strategy))


def averaged_weights(parts):
  """Context: the model holds the optimizer's moving averages of its weights (optimizer.ema_decay), else as is."""
  return averaged_weights_of(parts)()


def averaged_weights_of(parts):
  """averaged_weights(parts) as a context factory decided once: nothing to open without optimizer.ema_decay."""
  own = parts.optimizers.get("model")  # the averages of the model's own optimizer (none for a frozen one)
  if not optimizers.averages_weights(own):
    return contextlib.nullcontext
  model = parts.main_model
  return lambda: optimizers.averaged_weights(model, own)


def make(parts, run, preemption):
  """How this run trains and evaluates: loops/build.Parts (with its data settings) and the run and preemption
  settings."""
  cls = ParameterServerExecution if asynchronous(parts.strategy) else SyncExecution
  return cls(parts, run, preemption)


class _Execution:
  """What both families share: the step counter, eval results, train-metric read-out."""

  def __init__(self, parts, run, preemption):
    self.parts, self.data_settings, self.run_settings = parts, parts.data_settings, run
    self._watched = {"signals": preemption.signals, "exit_code": preemption.exit_code}  # the PreemptionWatcher's
    self.train_metrics = None
    self.averaged_weights = averaged_weights_of(parts)
    self._multi_worker = strategy_lib.is_multi_worker(parts.strategy)

  @property
  def step(self):
    return int(self.parts.step_counter.numpy())

  def _eval_step(self):
    p = self.parts
    return steps.make_eval_step(p.task, p.models, p.eval_means, p.task_metrics, p.plan.global_batch_size,
                                p.step_counter, p.plan.input_pipelines)

  def _eval_results(self, collected=None):
    """The eval metrics' results, and the task's reduce_eval of the values collected over the whole set."""
    results = {f"eval/{name}": float(m.result().numpy()) for name, m in self.parts.eval_metrics.items()}
    if collected is not None:
      reduced = task_lib.reduce_eval(self.parts.task, collected)
      results.update({f"eval/{name}": value for name, value in reduced.items()})
    return results

  def _reset(self, metrics):
    for metric in metrics.values():
      metric.reset_state()

  def _train_output(self, loss, results, worker_seconds=()):
    """results: {name: value} of the train metrics over the call, every replica and worker; worker_seconds:
    each worker's busy seconds in the call (multi-worker), summarised as train/slowest_worker_seconds and
    train/worker_time_spread (slowest / median - 1)."""
    results = {f"train/{name}": value for name, value in results.items()}
    if worker_seconds:
      results.update(stragglers.time_scalars(worker_seconds))
    finite = math.isfinite(loss) and math.isfinite(results["train/loss"])
    return TrainOutput(step=self.step, results=results, finite=finite, worker_seconds=tuple(worker_seconds))

  def _train_dataset(self, batch_size, start_step, **kwargs):
    p = self.parts
    return data.train_dataset(p.source, self.data_settings, batch_size=batch_size, seed=self.run_settings.seed,
                              start_step=start_step, **kwargs)


class SyncExecution(_Execution):
  """Synchronous strategies: a compiled loop of strategy.run steps, one reduction per call."""

  def __init__(self, parts, run, preemption):
    super().__init__(parts, run, preemption)
    strategy, p = parts.strategy, parts
    with metrics_scope(strategy):
      self.train_metrics = train_metrics(p.task)
    # TensorFlow refuses its clock op under op determinism: no worker times with deterministic=True.
    timed = self._multi_worker and not run.deterministic
    clock = steps.WorkerClock(strategy, p.role.worker_index, p.role.num_workers) if timed else None
    train_step = steps.make_task_train_step(p.task, p.models, p.optimizers, self.train_metrics,
                                            p.plan.global_batch_size, p.step_counter, p.plan.grad_accum_steps,
                                            run.jit_compile, clock, p.plan.input_pipelines)
    self._train_step, self._resident_fn = train_step, None
    self.step_memory = memory.StepPeak()  # the allocator's peak in train calls (summary.json memory_mb)
    self._service_watch = service_watch.train_call_watch(  # a bound on tf.data service waits
        self.data_settings.service, self.data_settings.service_timeout_seconds, preemption.exit_code)
    self._read_out = steps.CallReadOut(strategy, self.train_metrics, clock)
    self._train_fn = steps.make_train_fn(strategy, train_step, p.step_counter, self._read_out)
    collects = bool(p.task.eval_collect)
    self._eval_fn = (steps.make_collecting_eval_fn if collects else steps.make_eval_fn)(strategy, self._eval_step())
    self._eval_data = self._distribute(lambda batch, shards, index, local: data.eval_dataset(
        p.source, self.data_settings, batch_size=batch, num_shards=shards, shard_index=index, local_replicas=local))
    self._sum_over_workers = steps.make_sum_over_workers(strategy, parts.role.num_workers)
    self._iterator, self._start_step, self._norms = None, None, None  # the input starts in start_train

  def start_train(self):
    """Starts the train input at the current (restored) step and traces the train call, before the first call: a
    finished run or an evaluator never does. The trace does not count as waiting for the tf.data service."""
    with self._service_watch():  # a signal while the dispatcher is probed ends the probe
      self._start_train_input()
    steps_arg = tf.constant(1, tf.int32)  # the call's length is a tensor: one trace serves every length
    if tf.config.functions_run_eagerly():
      return  # nothing is traced
    if self._resident_fn is not None:
      self._resident_fn.get_concrete_function(steps_arg)
    else:
      self._train_fn.get_concrete_function(self._iterator, steps_arg)

  def train(self, num_steps):
    if self._resident_fn is None and self._iterator is None:  # not started by the loop (a direct call)
      self.start_train()
    with self._service_watch():
      with self.step_memory.measured():  # the steps, not the placing of a device-resident input
        if self._resident_fn is not None:
          read_out = self._resident_fn(tf.constant(num_steps, tf.int32))
        else:
          read_out = self._host_input_call(num_steps)
        values = read_out.numpy()
    return self._train_output(*self._read_out.results(values), self._read_out.worker_seconds(values))

  def _host_input_call(self, num_steps):
    """The train call on the host pipeline's iterator; an input function's short epoch is one line."""
    try:
      return self._train_fn(self._iterator, tf.constant(num_steps, tf.int32))
    except tf.errors.OpError as e:
      step, name = self.step, self.data_settings.name
      if self.parts.source.input_fn is None:
        raise
      short = user_stream.short_epoch(e, name, step, self.parts.plan.steps_per_epoch)
      failure = short or user_stream.input_failure(e, name, step)
      if failure is None:
        raise
      raise failure from e

  def train_graph_def(self, num_steps):
    """The traced train call of num_steps (train() ran it) as a GraphDef with its function library: the step's
    ops, which the replica check reads."""
    steps_arg = tf.constant(num_steps, tf.int32)
    if self._resident_fn is not None:
      traced = self._resident_fn.get_concrete_function(steps_arg)
    else:
      traced = self._train_fn.get_concrete_function(self._iterator, steps_arg)
    return traced.graph.as_graph_def()

  def _start_train_input(self):
    """The train split on the devices (data/resident.py decides) or the host pipeline's distributed iterator."""
    p, strategy = self.parts, self.parts.strategy
    if self._start_step is None:
      self._start_step = self.step  # made before the restore: the restored step
    decision = residency(p)
    logging.info("train input: %s (%s)", "device-resident" if decision.resident else "host pipeline", decision.reason)
    if self.data_settings.service:
      logging.warning(data_service.LOG_LINE, self.data_settings.service)
    if not decision.resident:
      self._iterator = iter(self._distribute(self._train_pipeline))
      return
    data_on_devices = resident_lib.ResidentTrainData(
        strategy, p.source, self.data_settings, global_batch_size=p.plan.global_batch_size,
        steps_per_epoch=p.plan.steps_per_epoch, seed=self.run_settings.seed,
        num_workers=p.plan.input_pipelines, worker_index=p.role.worker_index if self._multi_worker else 0)
    self._resident_fn = steps.make_resident_train_fn(strategy, self._train_step, p.step_counter, data_on_devices,
                                                     self._read_out)

  def _train_pipeline(self, batch, shards, index, local):
    return self._train_dataset(batch, self._start_step, steps_per_epoch=self.parts.plan.steps_per_epoch,
                               num_shards=shards, shard_index=index, local_replicas=local)

  def evaluate(self):
    self._reset(self.parts.eval_metrics)
    with self.averaged_weights():
      collected = self._eval_fn(self._eval_data)
    return self._eval_results(collected)

  def rewind(self, step):
    self._start_step = step  # the next call zeroes the train metrics' sums itself
    if self._resident_fn is None:  # a device-resident input draws each step's batch from the step counter
      self._iterator = None
      self.start_train()

  def agree_on_stop(self, reason):
    """One scalar all-reduce across workers per call; the reason text is exchanged only when one stops."""
    if not self._multi_worker:
      return reason
    if float(self._sum_over_workers(tf.constant(1.0 if reason else 0.0))) < 0.5:
      return None
    role = self.parts.role
    rows = np.zeros([role.num_workers, STOP_REASON_BYTES], np.float32)  # each worker fills its own row
    if reason:
      encoded = reason.encode()[:STOP_REASON_BYTES]
      rows[role.worker_index, :len(encoded)] = np.frombuffer(encoded, np.uint8)
    gathered = np.rint(self._sum_over_workers(tf.constant(rows)).numpy()).astype(np.uint8)
    first = next(row for row in gathered if row.any())
    return reason or bytes(first).rstrip(b"\0").decode(errors="replace")

  def gradient_norms(self):
    if self.parts.task.writes_step or self.parts.source.streams:
      return None  # a step-level task has no one loss to differentiate; the eval probe holds one stream only
    if self._norms is None:
      p = self.parts
      probe = next(iter(data.eval_dataset(p.source, self.data_settings, batch_size=min(64, p.plan.global_batch_size))))
      fn = steps.make_gradient_norms(p.strategy, p.task, p.models, p.plan.global_batch_size,
                                     p.step_counter)
      self._norms = lambda: fn(*probe[:2])
    return self._norms()

  def preemption(self, checkpoints):
    """The run's PreemptionWatcher; called by Checkpoints.restore_run (its handler restores when made)."""
    use_flag = isinstance(self.parts.strategy, tf.distribute.TPUStrategy)  # the handler does not cover TPUs here
    return PreemptionWatcher(self.parts.strategy, self._multi_worker, checkpoints, use_flag,
                             **self._watched)

  def _distribute(self, make_dataset):
    return distribute_dataset(self.parts.strategy, self.parts.plan.global_batch_size, make_dataset,
                              self._multi_worker)


def distribute_dataset(strategy, global_batch, make_dataset, per_worker=None):
  """make_dataset(batch_size, num_shards, shard_index, local_replicas) -> this pipeline's tf.data.Dataset.

  One worker: one pipeline batched by the global batch, split across replicas by tf.distribute.
  Several workers: one pipeline per worker (its shard), batched per replica; each local replica takes one batch.
  per_worker: whether the strategy is multi-worker (None: asks it).
  """
  if not (strategy_lib.is_multi_worker(strategy) if per_worker is None else per_worker):
    return strategy.experimental_distribute_dataset(make_dataset(global_batch, 1, 0, 1))

  def dataset_fn(context):
    local = context.num_replicas_in_sync // context.num_input_pipelines
    return make_dataset(context.get_per_replica_batch_size(global_batch), context.num_input_pipelines,
                        context.input_pipeline_id, local)

  return strategy.distribute_datasets_from_function(dataset_fn)


class ParameterServerExecution(_Execution):
  """The parameter-server coordinator: schedules steps on workers (ClusterCoordinator), evaluates itself.

  Train metrics live on the coordinator (workers would race on shared metric variables): each step returns its
  sums, added here after join(). The input cannot be rewound (per-worker datasets), so rules.py refuses rollback.
  """

  def __init__(self, parts, run, preemption):
    super().__init__(parts, run, preemption)
    p = parts
    self.train_metrics = train_metrics(p.task)
    train_step = steps.make_task_train_step(p.task, p.models, p.optimizers, None,
                                            p.plan.global_batch_size, p.step_counter, p.plan.grad_accum_steps,
                                            run.jit_compile)
    if isinstance(train_step, update_every.UpdateVariants):
      raise ConfigError(f"{type(p.task).__name__}.update_every needs a synchronous strategy: "
                        f"parameter_server workers step asynchronously, so no one step count says when a model "
                        f"updates; use mirrored or multi_worker_mirrored")
    self._coordinator = tf.distribute.coordinator.ClusterCoordinator(p.strategy)
    self._iterator = None  # made at the first train call, from the restored step

    names = list(p.task.train_metrics)

    @tf.function
    def worker_step(per_worker_iterator):
      result = p.strategy.run(train_step, args=next(per_worker_iterator))
      p.step_counter.assign_add(1)
      # One vector [loss, loss_sum, count, sum_1, count_1, ...]: the coordinator fetches it in one remote copy.
      parts = [result["loss"], result["loss_sum"], result["count"]] + [result[name] for name in names]
      return tf.concat([tf.reshape(tf.cast(part, tf.float32), [-1]) for part in parts], 0)

    self._worker_step = worker_step
    self._run_eval = self._make_eval(data.eval_dataset(p.source, self.data_settings,
                                                      batch_size=p.plan.global_batch_size))

  def _make_eval(self, eval_data):
    """fn() -> the collected values (or None): one pass over the eval set on the coordinator."""
    eval_step = self._eval_step()
    if self.parts.task.eval_collect:
      step = tf.function(eval_step, reduce_retracing=True)  # per batch: one trace for sequences of any length
      return lambda: steps.collected_rows(step(*batch) for batch in eval_data)

    @tf.function
    def run_eval():
      for features, targets, weights in eval_data:
        eval_step(features, targets, weights)

    return run_eval

  def _per_worker_input(self):
    p, start_step = self.parts, self.step
    return iter(self._coordinator.create_per_worker_dataset(lambda: self._train_dataset(
        p.plan.global_batch_size, start_step, steps_per_epoch=p.plan.steps_per_epoch, decorrelate=True)))

  def start_train(self):
    """The per-worker datasets from the current (restored) step, before the first call."""
    self._iterator = self._per_worker_input()

  def train(self, num_steps):
    if self._iterator is None:  # not started by the loop (a direct call)
      self.start_train()
    remote = [self._coordinator.schedule(self._worker_step, args=(self._iterator,)) for _ in range(num_steps)]
    self._coordinator.join()
    results = [r.fetch() for r in remote]
    self._reset(self.train_metrics)
    for result in results:
      steps.add_sums(self.train_metrics["loss"], result[1], result[2])
      for i, name in enumerate(self.parts.task.train_metrics):
        steps.add_sums(self.train_metrics[name], result[3 + 2 * i], result[4 + 2 * i])
    return self._train_output(float(results[-1][0]),
                              {name: float(m.result().numpy()) for name, m in self.train_metrics.items()})

  def evaluate(self):
    self._reset(self.parts.eval_metrics)
    with self.averaged_weights():
      collected = self._run_eval()
    return self._eval_results(collected)

  def rewind(self, step):
    raise ConfigError("parameter_server cannot rewind its per-worker datasets (nan_policy.mode='rollback')")

  def agree_on_stop(self, reason):
    return reason  # the coordinator alone decides

  def gradient_norms(self):
    return None

  def preemption(self, checkpoints):
    return PreemptionWatcher(self.parts.strategy, False, checkpoints, use_flag=True, **self._watched)

