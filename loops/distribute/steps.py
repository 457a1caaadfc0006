"""The compiled inner loops. `step_fn`s are plain per-replica functions; the returned callables are tf.functions."""

import contextlib
import functools

import keras
import numpy as np
import tensorflow as tf

from errors import ConfigError
from loops.modeling import keras_fit
from loops.modeling import losses
from loops.modeling import optimizers as optimizers_lib
from loops.modeling import random_layers
from loops import task as task_lib
from loops.task import context as context_lib
from loops.task import scaled_step
from loops.task import update_every


def make_task_train_step(task, models, optimizers, metrics, global_batch_size, step_counter, grad_accum_steps=1,
                         jit_compile=False, clock=None, input_pipelines=1, updating=None):
  """Per-replica train step of a task (loops/task): returns this replica's share of the global-batch loss.

  metrics: {"loss", *task.train_metrics} keras.metrics.Mean updated in place, or None to return their sums instead
  ({"loss", "loss_sum", "count", name: [sum, count]}: for parameter servers, whose workers would race on shared
  metric variables).
  Loss level: grad_accum_steps = k splits the replica's batch into k micro-batches whose gradients are summed
  before one update; every micro-loss is divided by the GLOBAL batch, so the update equals the whole batch's.
  Micro-batch i takes rows i, i + k, ... of the replica's batch: together, every replica's micro-batch i is one
  device's (what synchronized BatchNorm's statistics and ctx.all_gather see is the same on any replica count).
  A lone LossScaleOptimizer (float16) gets its loss scaled here and unscales the gradients itself.
  Step level: the task's train_step does it all (loops/rules.py refuses accumulation there; under float16 it
  scales each loss with its optimizer's scale_loss: loops/task/scaled_step.py).
  clock: a WorkerClock that adds the step's busy time (from `started`, or the step's start, to its gradients).
  Task.update_every: an UpdateVariants (loops/task/update_every.py), one such step per combination of models that
  update (`updating`: {trained model name: updates?}, ctx.updates), each step's chosen by run_step.
  """
  if updating is None:
    return update_every.variants_or_step(task.update_every, list(optimizers), lambda updating: make_task_train_step(
        task, models, optimizers, metrics, global_batch_size, step_counter, grad_accum_steps, jit_compile, clock,
        input_pipelines, updating))
  @tf.autograph.experimental.do_not_convert
  def new_context(micro_batch=(0, 1)):
    return context_lib.StepContext(global_batch_size, step_counter, training=True, declared=task.train_metrics,
                                   input_pipelines=input_pipelines, micro_batch=micro_batch, updating=updating,
                                   streams=task.streams)

  step_method = "train_step" if task.writes_step else "per_example_loss"
  if task.writes_step:
    @tf.autograph.experimental.do_not_convert
    def compute(batch):
      ctx = new_context()
      with random_layers.keyed(ctx):
        loss = task_lib.checked_step_loss(task, task_lib.user_call(scaled_step.train_step, task, batch, models,
                                                                   optimizers, ctx))
      return loss, None, ctx.logged(), [loss]
  else:
    compute = _loss_level(task, models, optimizers, new_context, grad_accum_steps, jit_compile, updating)

  @tf.autograph.experimental.do_not_convert  # the framework's step: the task's code is converted (task_lib.user_call)
  def step_fn(features, targets, started=None):
    if clock is not None and started is None:
      started = tf.timestamp()
    with keras_fit.fit_steps_refused(models, task_lib.method_name(task, step_method)):
      loss, per_example, logged, done = compute(task_lib.stream_batch(task, features, targets))
    if clock is not None:
      clock.record(started, done)
    return _report(loss, per_example, logged, metrics)

  return step_fn


def _loss_level(task, models, optimizers, new_context, grad_accum_steps, jit_compile, updating):
  """compute(batch) -> (loss, per-example losses, logged sums, gradients) after applying the optimizer of every
  model that updates in this step (`updating`; the others' gradients are not computed: Task.update_every)."""
  trained = list(optimizers)
  applied = [name for name in trained if updating[name]]
  variables = [v for name in applied for v in models[name].trainable_variables]
  sizes = [len(models[name].trainable_variables) for name in applied]
  lone = optimizers[trained[0]] if len(trained) == 1 and applied else None
  scales_loss = isinstance(lone, keras.optimizers.LossScaleOptimizer)
  summed_here = bool(task.transforms_gradients and applied)

  @tf.autograph.experimental.do_not_convert
  def gradients_of(batch, micro_batch):
    ctx = new_context(micro_batch)
    with tf.GradientTape() as tape, random_layers.keyed(ctx):
      per_example = task_lib.user_call(task.per_example_loss, batch, models, ctx)
      loss, per_example = _averaged(task, per_example, batch, ctx)
      if micro_batch[0] == 0:  # the regularization once per update
        for name in trained:
          if models[name].losses:
            loss += ctx.regularization(models[name])
      scaled = lone.scale_loss(loss) if scales_loss else loss
    return tape.gradient(scaled, variables), loss, per_example, ctx.logged()

  @tf.autograph.experimental.do_not_convert
  def gradients(batch):
    if grad_accum_steps == 1:
      return gradients_of(batch, (0, 1))
    total, loss, per_example, logged = None, 0.0, [], {}
    for i in range(grad_accum_steps):  # rows i, i + k, ...: micro-batch i of every replica is one device's
      micro = tf.nest.map_structure(lambda t: t[i::grad_accum_steps], batch)
      g, l, p, named = gradients_of(micro, (i, grad_accum_steps))
      total = g if total is None else [a + b for a, b in zip(total, g)]
      loss += l
      per_example.append(p)
      logged = _added(logged, named)
    return total, loss, None if per_example[0] is None else tf.concat(per_example, 0), logged

  if jit_compile:
    gradients = tf.function(gradients, jit_compile=True)

  @tf.autograph.experimental.do_not_convert
  def compute(batch):
    grads, loss, per_example, logged = gradients(batch)
    if summed_here:
      unscale = lone.scale_loss(tf.constant(1.0)) if scales_loss else None
      grads, named = _transformed_sum(task, dict(zip(applied, sizes)), grads, new_context(), unscale)
      logged = _added(logged, named)
    with optimizers_lib.gradients_already_summed() if summed_here else contextlib.nullcontext():
      begin = 0
      for name, size in zip(applied, sizes):
        optimizers_lib.sum_clip_apply(optimizers[name], grads[begin:begin + size], variables[begin:begin + size])
        begin += size
    return loss, per_example, logged, grads

  return compute


@tf.autograph.experimental.do_not_convert
def _averaged(task, per_example, batch, ctx):
  """(this replica's share of the global loss, per-example losses or None) from per_example_loss's return: losses
  [replica batch], or for a task with streams {stream: losses [that stream's replica batch]}, each averaged over its
  stream's global batch and added (reported as the step's share, like a step-level loss)."""
  where = task_lib.method_name(task, "per_example_loss")
  main = batch[next(iter(task.streams))] if task.streams else batch
  if not isinstance(per_example, dict):
    per_example = tf.cast(per_example, tf.float32)
    losses.check_per_example(where, per_example, tf.nest.flatten(main)[0])
    return ctx.average(per_example), per_example
  unknown = sorted(set(per_example) - set(task.streams))
  if not per_example or unknown:
    raise ConfigError(f"{where} returned a dict with keys {sorted(per_example)}; a dict maps the task's streams "
                      f"{list(task.streams)} to their per-example losses")
  loss = 0.0
  for name, values in per_example.items():
    values = tf.cast(values, tf.float32)
    losses.check_per_example(f"{where}['{name}']", values, tf.nest.flatten(batch[name])[0])
    loss += ctx.average(values, stream=name)
  return loss, None


@tf.autograph.experimental.do_not_convert
def _added(logged, more):
  """{name: (sum, count)} of two steps' ctx.log sums."""
  total = dict(logged)
  for name, (value, count) in more.items():
    before = total.get(name, (0.0, 0.0))
    total[name] = (before[0] + value, before[1] + count)
  return total


def _transformed_sum(task, sizes, grads, ctx, loss_scale=None):
  """(flat gradients, ctx.log sums): the gradients summed over every replica and worker in one all-reduce, given
  to task.transform_gradients by model ({name: [...]}, unscaled under float16), and its result flattened back."""
  present = [i for i, g in enumerate(grads) if g is not None]
  summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
  flat = list(grads)
  for i, g in zip(present, summed):
    flat[i] = g if loss_scale is None else g / loss_scale
  by_model, begin = {}, 0
  for name, size in sizes.items():
    by_model[name], begin = flat[begin:begin + size], begin + size
  returned = task_lib.user_call(task.transform_gradients, by_model, ctx)
  where = task_lib.method_name(task, "transform_gradients")
  lengths = lambda gradients: {name: len(values) for name, values in gradients.items()}
  if not isinstance(returned, dict) or lengths(returned) != lengths(by_model):
    raise ConfigError(f"{where} must return {{model name: [one gradient per trainable variable]}} for "
                      f"{sorted(by_model)}, as it got them")
  out = [g for name in sizes for g in returned[name]]
  return (out if loss_scale is None else [None if g is None else g * loss_scale for g in out]), ctx.logged()


@tf.autograph.experimental.do_not_convert
def _report(loss, per_example, logged, metrics):
  """Adds the step's loss and logged sums to the train metrics (or returns them: parameter servers)."""
  if per_example is None:  # step level: the replica's share of the global loss; the read-out sums the shares
    loss_sum, count = loss * tf.cast(tf.distribute.get_replica_context().num_replicas_in_sync, tf.float32), 1.0
  else:
    loss_sum, count = tf.reduce_sum(per_example), tf.cast(tf.size(per_example), tf.float32)
  if metrics is None:
    sums = {name: tf.stack([total, count]) for name, (total, count) in logged.items()}
    return {"loss": loss, "loss_sum": loss_sum, "count": count, **sums}
  add_sums(metrics["loss"], loss_sum, count)
  for name, (total, n) in logged.items():
    add_sums(metrics[name], total, n)
  return loss


@tf.autograph.experimental.do_not_convert
def add_sums(mean, total, count):
  """A keras.metrics.Mean's update from a (sum, count) pair (what update_state does with per-example values)."""
  mean.total.assign_add(tf.cast(total, mean.total.dtype))
  mean.count.assign_add(tf.cast(count, mean.count.dtype))


class WorkerClock:
  """Each worker's busy seconds in a train call: per step, from its start (before the batch is fetched) to its
  gradients being computed, summed over the call: the time a worker does not spend waiting for its peers in the
  gradient all-reduce, so a straggler stands out (its peers' busy time stays low while they wait for it). The
  sums ride in the call's one read-out all-reduce, each worker in its own slot. Host clock: on GPUs a step's
  kernels run asynchronously, so there it is the time to enqueue them plus the waits for input."""

  def __init__(self, strategy, worker_index, num_workers):
    self.worker_index, self.num_workers = worker_index, num_workers
    self.local_replicas = strategy.num_replicas_in_sync // num_workers
    with strategy.scope():
      self.busy = tf.Variable(0.0, trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                              aggregation=tf.VariableAggregation.SUM)

  @tf.autograph.experimental.do_not_convert
  def record(self, started, gradients):
    """Replica context: adds now - started once the gradients exist."""
    ready = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients if g is not None]
    with tf.control_dependencies(ready):
      self.busy.assign_add(tf.cast(tf.timestamp() - started, tf.float32))

  @tf.autograph.experimental.do_not_convert
  def slots(self):
    """Replica context: this replica's share of its worker's busy seconds, in the worker's slot."""
    return tf.one_hot(self.worker_index, self.num_workers) * (self.busy / self.local_replicas)


class CallReadOut:
  """What a train call returns, in ONE all-reduce at its last step: the step's global loss and, for each train
  metric (a keras.metrics.Mean: total / count), its replica-local sums, which the call zeroes when it starts;
  with a WorkerClock, each worker's busy seconds in the call.
  Reading and resetting the metrics from the host between calls costs a blocking collective per metric variable
  and eager assigns: 34-45 ms per call between 2 workers here, measured (benchmarks/README.md)."""

  def __init__(self, strategy, metrics=None, clock=None):
    metrics = metrics or {}
    for name, metric in metrics.items():
      if not isinstance(metric, keras.metrics.Mean):
        raise TypeError(f"train metric '{name}' must be a keras.metrics.Mean (total / count), got {type(metric)}")
    self.strategy, self.names = strategy, list(metrics)
    self.sums = [v for metric in metrics.values() for v in (metric.total, metric.count)]
    # A copy per replica (mirrored, multi-worker, TPU) is summed by the all-reduce; a single copy (one device,
    # central storage) already holds every replica's sum and is read as it is.
    self.per_replica = any(isinstance(v.value, tf.distribute.DistributedValues) for v in self.sums)
    self.clock = clock
    if clock is not None and not self.per_replica:
      raise ValueError("a WorkerClock needs train metrics with a copy per replica")

  @tf.autograph.experimental.do_not_convert
  def initial(self):
    width = self.clock.num_workers if self.clock else 0
    return tf.zeros([1 + len(self.sums) + width] if self.sums else [])

  @tf.autograph.experimental.do_not_convert
  def start(self):
    """Cross-replica context, at the call's start: the sums are zeroed (each replica its own copy)."""
    zeroed = self.sums + ([self.clock.busy] if self.clock else [])
    zero = lambda: [v.assign(tf.zeros(v.shape, v.dtype)) for v in zeroed]
    if self.per_replica:
      self.strategy.run(zero)
    else:
      zero()

  @tf.autograph.experimental.do_not_convert  # a method, not __call__: AutoGraph converts an object's __call__ anyway
  def reduced(self, per_replica_loss):
    """Cross-replica context: the global loss (a scalar), or [loss, total_1, count_1, ...] over all replicas."""
    reduce = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
    as_vector = lambda loss: tf.concat([tf.stack([tf.cast(loss, tf.float32)] +
                                                 [tf.cast(v, tf.float32) for v in self.sums])] +
                                       ([self.clock.slots()] if self.clock else []), 0)
    if not self.sums:
      return reduce(per_replica_loss)
    if self.per_replica:
      return reduce(self.strategy.run(as_vector, args=(per_replica_loss,)))
    return as_vector(reduce(per_replica_loss))

  def results(self, values):
    """Host side: (loss, {name: total / count}) from a call's read-out (0 where nothing was counted)."""
    values = np.asarray(values, np.float64).reshape(-1)[:1 + len(self.sums)]
    totals, counts = values[1::2], values[2::2]
    return float(values[0]), {name: float(t / c) if c else 0.0 for name, t, c in zip(self.names, totals, counts)}

  def worker_seconds(self, values):
    """Host side: each worker's busy seconds in the call (WorkerClock), or () without a clock."""
    if self.clock is None:
      return ()
    return tuple(float(v) for v in np.asarray(values, np.float64).reshape(-1)[1 + len(self.sums):])


@tf.autograph.experimental.do_not_convert
def run_step(strategy, step_fn, step_counter, args, kwargs=None):
  """Cross-replica context: strategy.run(step_fn, args, kwargs); of an UpdateVariants step (Task.update_every) the
  variant of this step, chosen here by tf.switch_case on the step counter: an optimizer's all-reduce (merge_call)
  compiles inside control flow around strategy.run, not inside the replica function."""
  if not isinstance(step_fn, update_every.UpdateVariants):
    return strategy.run(step_fn, args=args, kwargs=kwargs)
  runs = [functools.partial(strategy.run, step, args=args, kwargs=kwargs) for step in step_fn.steps]
  return tf.switch_case(step_fn.index(step_counter.read_value()), runs)


def steps_loop(num_steps, one_step, initial):
  """The result of one_step(i, result) -> (i + 1, result) for i in 0..num_steps-1: a tf.while_loop (num_steps int32)."""
  return tf.while_loop(lambda i, _: i < num_steps, one_step, (tf.constant(0), initial), maximum_iterations=num_steps)[1]


def last_step_result(i, num_steps, read_out, per_replica_loss, result):
  """read_out.reduced(per_replica_loss) at the call's last step, else `result`: one cross-replica reduction per
  call, not per step (a collective per step costs)."""
  return tf.cond(tf.equal(i, num_steps - 1), lambda: read_out.reduced(per_replica_loss), lambda: result)


def make_train_fn(strategy, step_fn, step_counter, read_out=None):
  """tf.function(iterator, num_steps) -> read_out of the last step (CallReadOut; default: its global loss); runs
  num_steps steps in one call."""
  read_out = read_out or CallReadOut(strategy)

  timed = read_out.clock is not None

  @tf.function(autograph=False)  # the loop written out: converting it cost ~0.2 s of every process's first call
  def train_fn(iterator, num_steps):
    read_out.start()

    def one_step(i, result):
      started = tf.timestamp() if timed else None  # before the batch: a worker's input waits count as its own
      batch = next(iterator)
      per_replica_loss = run_step(strategy, step_fn, step_counter, batch, {"started": started} if timed else None)
      step_counter.assign_add(1)
      return i + 1, last_step_result(i, num_steps, read_out, per_replica_loss, result)

    return steps_loop(num_steps, one_step, read_out.initial())

  return train_fn


def make_resident_train_fn(strategy, step_fn, step_counter, resident, read_out=None):
  """tf.function(num_steps) -> read_out of the last step (as make_train_fn); each step's batch is gathered on the
  devices from `resident` (data/resident.py) by the step counter: no iterator, nothing handed over from the host.
  The rows of the whole call are computed once; each replica gathers its images a block of steps at a time."""
  block_steps = tf.constant(resident.steps_per_block, tf.int32)
  read_out = read_out or CallReadOut(strategy)

  def reading_the_block(step):
    @tf.autograph.experimental.do_not_convert
    def read_and_step(block, i):
      return step(*resident.step_batch(block, i))
    return read_and_step

  replica_step = update_every.each_step(step_fn, reading_the_block)

  @tf.function(autograph=False)  # the loops written out, as make_train_fn's
  def train_fn(num_steps):
    read_out.start()
    first_step = step_counter.read_value()
    rows = resident.call_indices(first_step, num_steps)

    def one_block(begin, result):
      size = tf.minimum(block_steps, num_steps - begin)
      block = strategy.run(resident.replica_block,
                           args=(rows[begin:begin + size], first_step + tf.cast(begin, tf.int64)))

      def one_step(i, result):
        per_replica_loss = run_step(strategy, replica_step, step_counter, (block, i))
        step_counter.assign_add(1)
        return i + 1, last_step_result(begin + i, num_steps, read_out, per_replica_loss, result)

      return begin + block_steps, steps_loop(size, one_step, result)

    blocks = (num_steps + block_steps - 1) // block_steps
    return tf.while_loop(lambda begin, _: begin < num_steps, one_block, (tf.constant(0), read_out.initial()),
                         maximum_iterations=blocks)[1]

  return train_fn


def make_eval_step(task, models, means, task_metrics, global_batch_size, step_counter, input_pipelines=1):
  """Per-replica eval step over (features, targets, weights); weight-0 rows are padding. The task's per-example
  values go into `means` (weighted); it updates its own Keras metrics (task_metrics) itself. Returns the values
  named in task.eval_collect, with the weights, for make_collecting_eval_fn (None when there are none)."""
  collect = tuple(task.eval_collect)

  @tf.autograph.experimental.do_not_convert  # the framework's step: the task's code is converted (task_lib.user_call)
  def step_fn(features, targets, weights):
    ctx = context_lib.StepContext(global_batch_size, step_counter, training=False, metrics=task_metrics,
                                  weights=weights, input_pipelines=input_pipelines, streams=task.streams)
    with random_layers.keyed(ctx), keras_fit.fit_steps_refused(models, task_lib.method_name(task, "eval_step")):
      values = task_lib.user_call(task.eval_step, task_lib.eval_batch(task, features, targets), models, ctx)
    for name, value in values.items():
      if name not in collect:  # a padding row's value never counts, not even a NaN (0 * NaN is NaN)
        value = tf.where(weights > 0, tf.cast(value, tf.float32), 0.0)
        means[name].update_state(value, sample_weight=weights)
    return ({name: values[name] for name in collect}, weights) if collect else None

  return step_fn


def make_eval_fn(strategy, step_fn):
  """tf.function(distributed eval dataset): one full pass; metrics hold the totals over all replicas."""

  def one_batch(state, batch):
    strategy.run(step_fn, args=batch)
    return state

  @tf.function(autograph=False)  # the loop written out (DistributedDataset.reduce, what AutoGraph makes of it)
  def eval_fn(dataset):
    dataset.reduce((), one_batch)

  return eval_fn


def make_collecting_eval_fn(strategy, step_fn):
  """fn(distributed eval dataset) -> {name: numpy [eval examples, ...]}: one full pass like make_eval_fn, each
  batch's collected values gathered from every replica and worker, padding rows dropped."""
  gathered = make_gathered(strategy, step_fn)
  return lambda dataset: collected_rows(gathered(batch) for batch in dataset)


def make_gathered(strategy, step_fn):
  """tf.function(distributed batch) -> step_fn's outputs of every replica and worker, concatenated along the batch
  in replica order (on every worker). (The all-gather runs in the replica context: TF 2.21's strategy.gather
  inside a tf.function returns only the first replica's rows.)"""

  def step_and_gather(*batch):  # tf.identity: values passed through from the input have no device to gather to
    values = tf.nest.map_structure(tf.identity, step_fn(*batch))
    return tf.distribute.get_replica_context().all_gather(values, axis=0)

  @tf.function(reduce_retracing=True)  # called per batch: sequences padded per batch would retrace per length
  def gathered(batch):
    return strategy.experimental_local_results(strategy.run(step_and_gather, args=batch))[0]

  return gathered


def make_predict_step(task, models, global_batch_size, step_counter, input_pipelines=1, labels=False):
  """Per-replica step over (features, targets, weights, index): ({name: the task's predict_step outputs, and
  "label": the targets when `labels`}, weights, index). An output whose first dimension is not the batch's is one
  line naming it."""
  method = task_lib.method_name(task, "predict_step")

  def step_fn(features, targets, weights, index):
    ctx = context_lib.StepContext(global_batch_size, step_counter, training=False, weights=weights,
                                  input_pipelines=input_pipelines, streams=task.streams)
    with random_layers.keyed(ctx), keras_fit.fit_steps_refused(models, method):
      outputs = task.predict_step(task_lib.eval_batch(task, features, targets), models, ctx)
    if not isinstance(outputs, dict) or not outputs:
      raise ConfigError(f"{method} must return {{name: per-example outputs}}, got {type(outputs).__name__}")
    rows = weights.shape[0]
    for name, value in outputs.items():
      if value.shape.rank == 0 or value.shape[0] not in (None, rows):
        raise ConfigError(f"{method}: output '{name}' has shape {value.shape.as_list()}, not one row per example "
                          f"of the batch of {rows} ([{rows}, ...])")
    return ({**outputs, "label": targets} if labels else outputs), weights, index

  return step_fn


def collected_rows(batches):
  """{name: numpy [examples, ...]} of (collected values, weights) per eval batch, weight-0 (padding) rows dropped."""
  batches = [tf.nest.map_structure(lambda t: t.numpy(), batch) for batch in batches]
  weights = np.concatenate([w for _, w in batches]) > 0
  return {name: np.concatenate([values[name] for values, _ in batches])[weights] for name in batches[0][0]}


def make_sum_over_workers(strategy, num_workers):
  """tf.function(value) -> the element-wise sum over workers of each worker's host `value` (tf.distribute reduces
  by SUM or MEAN only; each of a worker's local replicas contributes its share)."""
  local_replicas = strategy.num_replicas_in_sync // num_workers

  @tf.function
  def sum_over_workers(value):
    per_replica = strategy.run(lambda v: v / local_replicas, args=(value,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

  return sum_over_workers


def make_gradient_norms(strategy, task, models, global_batch_size, step_counter):
  """fn(features, targets) -> per-variable gradient norms of the mean loss for the model named "model", on a
  fixed probe batch (inference mode: BatchNorm statistics untouched; no optimizer step). Loss-level tasks only.
  Runs on every replica without collectives; returns replica 0's."""
  model = models["model"]

  def norms(features, targets):
    ctx = context_lib.StepContext(global_batch_size, step_counter, training=False)
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(task.per_example_loss((features, targets), models, ctx))
    return tf.stack([tf.norm(g) for g in tape.gradient(loss, model.trainable_variables)])

  @tf.function
  def run(features, targets):
    return strategy.run(norms, args=(features, targets))

  return lambda features, targets: strategy.experimental_local_results(run(features, targets))[0].numpy()
