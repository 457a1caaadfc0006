"""The contenders of benchmarks.throughput: each a timed window of training on one strategy, model, data and batch.

A window runs `window_calls` calls of train.steps_per_loop steps and returns its seconds, or None to be timed by
the caller. Every model starts from the same reference weights.
"""

import time

import keras
import tensorflow as tf

import data
from configs import settings
from data import resident as resident_lib
from loops import plan as plan_lib
from loops.core import plugins
from loops.distribute import cluster
from loops.distribute import steps
from loops.distribute import strategy as strategy_lib
from loops.modeling import fused_batchnorm
from loops.modeling import losses
from loops.modeling import model as model_lib
from loops.modeling import optimizers
from loops.task import classification

# The built-in classification written as a user's loss-level task: what the contract costs a user's step.
USER_TASK = "examples.tasks.digits:Classifier"

class Nothing:
  """A metric that does nothing (the no-metrics lever)."""

  def update_state(self, *args, **kwargs):
    pass


class OneBatch:
  """For make_resident_train_fn: every step trains on the same preprocessed batch, each replica its share of it,
  sliced once per call (per step: no gather, no augmentation, no op at all: the loop's upper bound)."""

  steps_per_block = 1 << 30

  def __init__(self, batch, replicas):
    self.images, self.labels = tf.constant(batch[0]), tf.constant(batch[1])
    self.per_replica = len(batch[1]) // replicas

  def call_indices(self, first_step, num_steps):
    return tf.zeros([num_steps])

  def replica_block(self, rows, first_step):
    start = tf.distribute.get_replica_context().replica_id_in_sync_group * self.per_replica
    return self.images[start:start + self.per_replica], self.labels[start:start + self.per_replica]

  def step_batch(self, block, i):
    return block


class EpochTimer(keras.callbacks.Callback):
  """fit's time from on_epoch_begin to on_epoch_end: its per-call set-up is not counted."""
  seconds = None

  def on_epoch_begin(self, epoch, logs=None):
    self._started = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.seconds = time.perf_counter() - self._started


def with_options(dataset, threads=None, slack=False):
  """The input pipeline on tf.data's shared thread pool (threads=0), or with prefetch slack."""
  options = tf.data.Options()
  if threads == 0:
    options.threading.private_threadpool_size = 0
    options.threading.max_intra_op_parallelism = 0
  options.experimental_slack = slack
  return dataset.with_options(options)


class Contenders:
  """Builds the contenders' windows for one config (its strategy, data, model, global batch and steps per call)."""

  def __init__(self, config, window_calls):
    self.config, self.window_calls = config, window_calls
    read = settings.read(config)
    strategy_lib.configure_devices(read.run)
    self.strategy = strategy_lib.build(read.run, read.cluster, cluster.ClusterRole())
    keras.utils.set_random_seed(config.seed)
    self.source = data.load(config.data)
    self.plan = plan_lib.derive(config.train, config.optimizer, self.strategy.num_replicas_in_sync,
                                self.source.train_size)
    self.input_shape = data.output_shape(self.source, config.data.image_size)
    self.loss_fn = losses.build(config.loss)
    self.steps_per_call = self.plan.steps_per_loop
    self.steps_per_window = self.steps_per_call * window_calls
    self.residency = resident_lib.decide(self.source, config.data, synchronous=True)
    with self.strategy.scope():
      self.reference = self.bare_model()
    self.fused_layers = fused_batchnorm.fused_layers(self.fresh_model(batchnorm=config.model)[0])  # as a run has it

  def bare_model(self):
    """config.model as a run builds it (model.name: the registry or module:function; model.kwargs), before any
    precision, synchronized or fused BatchNorm is applied."""
    function = model_lib.model_function(self.config.model.name)
    return function(tuple(self.input_shape), int(self.source.num_classes), **dict(self.config.model.kwargs))

  def runners(self, levers=False, only=None):
    """name -> window: framework, keras_fit, bare_loop, synthetic (user_task when `only` names it); host_pipeline and
    input_only when the framework's input is device-resident; framework_keras_bn when it fuses BatchNorm layers;
    the lever_* variants. `only`: build just these (and the levers): the others' models and pipelines are never
    made."""
    resident, dataset = self.residency.resident, self.real_dataset
    makers = {"framework": lambda: self.framework(dataset(), resident=resident), "keras_fit": self.keras_fit,
              "bare_loop": self.bare_loop, "synthetic": lambda: self.framework(None, resident="one_batch")}
    if only and "user_task" in only:  # asked for by name only (a classification config's loss, no mixing)
      makers["user_task"] = lambda: self.framework(dataset(), resident=resident, task=USER_TASK)
    if resident:
      makers["host_pipeline"] = lambda: self.framework(dataset())
      makers["input_only"] = self.input_only
    if self.fused_layers:
      keras_batchnorm = self.config.model.copy_and_resolve_references()
      keras_batchnorm.fused_batchnorm = False
      makers["framework_keras_bn"] = lambda: self.framework(dataset(), resident=resident, batchnorm=keras_batchnorm)
    runners = {name: make() for name, make in makers.items() if only is None or name in only}
    if levers:
      runners.update({"lever_python_loop": self.framework(dataset(), python_loop=True),
                      "lever_no_metrics": self.framework(dataset(), with_metrics=False),
                      "lever_pipeline_shared_threads": self.framework(with_options(dataset(), threads=0)),
                      "lever_pipeline_slack": self.framework(with_options(dataset(), slack=True)),
                      "lever_bfloat16": self.framework(dataset(), policy="mixed_bfloat16"),
                      "lever_xla": self.framework(dataset(), jit_compile=True)})
    return runners

  def real_dataset(self):
    return data.train_dataset(self.source, self.config.data, batch_size=self.plan.global_batch_size,
                              steps_per_epoch=self.plan.steps_per_epoch, seed=self.config.seed)

  def resident_data(self):
    return resident_lib.ResidentTrainData(self.strategy, self.source, self.config.data, seed=self.config.seed,
                                          global_batch_size=self.plan.global_batch_size,
                                          steps_per_epoch=self.plan.steps_per_epoch)

  def fresh_model(self, policy=None, batchnorm=None):
    """A copy of the reference weights; `batchnorm`: a model config whose BatchNorm choices apply (a run's)."""
    with self.strategy.scope():
      if policy:  # the same weights in a model built under a mixed-precision policy
        previous = keras.mixed_precision.dtype_policy()
        keras.mixed_precision.set_dtype_policy(policy)
        try:
          model = self.bare_model()
        finally:
          keras.mixed_precision.set_dtype_policy(previous)
      else:
        model = keras.models.clone_model(self.reference)
      model.set_weights(self.reference.get_weights())
      if batchnorm is not None:
        model_lib.configure_batchnorm(model, batchnorm)
      optimizer = optimizers.build(self.config.optimizer, self.plan.learning_rate)
      optimizer.build(model.trainable_variables)
    return model, optimizer

  def new_counter(self):
    with self.strategy.scope():
      return tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def framework(self, dataset, python_loop=False, with_metrics=True, policy=None, jit_compile=False, resident=False,
                batchnorm=None, task=None):
    """The framework's compiled loop over `dataset`, over the device-resident split (resident=True) or over one
    batch (resident="one_batch"); the model with the run's BatchNorm unless `batchnorm` says otherwise; the
    built-in classification step, or `task` (a user's loss-level Task with train_metrics ("accuracy",))."""
    model, optimizer = self.fresh_model(policy, self.config.model if batchnorm is None else batchnorm)
    with self.strategy.scope():
      metrics = {"loss": keras.metrics.Mean(), "accuracy": keras.metrics.SparseCategoricalAccuracy()}
    if not with_metrics:
      metrics = {"loss": Nothing(), "accuracy": Nothing()}
    counter = self.new_counter()
    trained = classification.ImageClassification(self.loss_fn) if task is None else plugins.load(task, "task")()
    step_fn = steps.make_task_train_step(trained, {"model": model}, {"model": optimizer}, metrics,
                                         self.plan.global_batch_size, counter, jit_compile=jit_compile)
    read_out = steps.CallReadOut(self.strategy, metrics) if with_metrics else None  # the run's call returns it
    iterator = None
    if resident:
      on_devices = (OneBatch(next(iter(self.real_dataset())), self.plan.replicas) if resident == "one_batch"
                    else self.resident_data())
      resident_fn = steps.make_resident_train_fn(self.strategy, step_fn, counter, on_devices, read_out)
      train_fn = lambda _, calls: resident_fn(calls)  # noqa: E731
    else:
      train_fn = steps.make_train_fn(self.strategy, step_fn, counter, read_out)
      iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
    calls = tf.constant(1 if python_loop else self.steps_per_call, tf.int32)
    repeats = self.steps_per_call if python_loop else 1

    def window():
      for _ in range(self.window_calls * repeats):
        result = train_fn(iterator, calls)
      result.numpy()  # one host sync per window, as the run does per summary interval
    return window

  def input_only(self):
    """The device-resident input alone: the same compiled loop and batches, a step that only reads its batch (one
    pass over it, so nothing is pruned): what the real input adds to a step, with far less noise than the
    difference of two step rates."""
    counter = self.new_counter()
    read_batch = lambda images, labels: tf.reduce_sum(images) + tf.reduce_sum(tf.cast(labels, tf.float32))  # noqa: E731
    input_fn = steps.make_resident_train_fn(self.strategy, read_batch, counter, self.resident_data())
    calls = tf.constant(self.steps_per_call, tf.int32)

    def window():
      for _ in range(self.window_calls):
        total = input_fn(calls)
      float(total)
    return window

  def keras_fit(self):
    """Keras fit on the same pipeline, steps_per_execution = train.steps_per_loop."""
    model, optimizer = self.fresh_model()
    with self.strategy.scope():
      model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"], steps_per_execution=self.steps_per_call)
    dataset, timer = self.real_dataset(), EpochTimer()

    def window():
      model.fit(dataset, epochs=1, steps_per_epoch=self.steps_per_window, verbose=0, callbacks=[timer])
      return timer.seconds
    return window

  def bare_loop(self):
    """The TF custom-training tutorial: one strategy.run + strategy.reduce step per tf.function call."""
    model, optimizer = self.fresh_model()
    global_batch_size = self.plan.global_batch_size

    def step_fn(images, labels):
      with tf.GradientTape() as tape:
        logits = model(images, training=True)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      return loss

    @tf.function
    def train_step(batch):
      return self.strategy.reduce(tf.distribute.ReduceOp.SUM, self.strategy.run(step_fn, args=batch), axis=None)

    iterator = iter(self.strategy.experimental_distribute_dataset(self.real_dataset()))

    def window():
      for _ in range(self.steps_per_window):
        loss = train_step(next(iterator))
      float(loss)
    return window


def gemm_peak_gflops(n=2048, repeats=10):
  """The machine's float32 matmul rate: the best of 3 chains of `repeats` n x n matmuls."""
  a = tf.random.normal([n, n])
  b = tf.random.normal([n, n])

  @tf.function
  def chain():
    c = a
    for _ in range(repeats):
      c = tf.matmul(c, b) * 1e-3
    return tf.reduce_sum(c)

  chain().numpy()
  best = float("inf")
  for _ in range(3):
    started = time.perf_counter()
    chain().numpy()
    best = min(best, time.perf_counter() - started)
  return 2 * n ** 3 * repeats / best / 1e9


def training_gflops_per_image(model, loss_fn, input_shape, batch=8):
  """Float operations of one forward + backward pass, from the TF profiler, per image."""
  @tf.function
  def grads(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(loss_fn(y, tf.cast(model(x, training=True), tf.float32)))
    return tape.gradient(loss, model.trainable_variables)

  graph = grads.get_concrete_function(tf.TensorSpec([batch, *input_shape]), tf.TensorSpec([batch], tf.int64)).graph
  builder = tf.compat.v1.profiler.ProfileOptionBuilder
  options = builder(builder.float_operation()).with_empty_output().build()
  stats = tf.compat.v1.profiler.profile(graph, options=options)
  return stats.total_float_ops / batch / 1e9
