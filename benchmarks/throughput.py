"""Throughput, side by side in one process: the framework's loop vs Keras fit vs a bare loop vs on-device data.

  python -m benchmarks.throughput --config=configs/digits_cnn.py [--config.key=value ...] [--out=results.json]
      [--windows=N] [--window_calls=N] [--contenders=framework,synthetic,...] [--levers]

Same model, data, strategy, global batch and steps per call for all four:
  framework  the framework's compiled loop (loops.steps) over the real input pipeline (data.train_dataset)
  keras_fit  model.fit with steps_per_execution = train.steps_per_loop on the same pipeline
  bare_loop  the TF custom-training tutorial: one strategy.run + strategy.reduce step per tf.function call
  synthetic  the framework's loop on one preprocessed batch held on the devices (no input work): the upper bound
  host_pipeline  the framework's loop over the tf.data pipeline, when "framework" is device-resident
  input_only  the device-resident input alone (the same loop and batches, a step that only reads its batch):
             input_share_of_step = its time per step / framework's, the input's cost without a difference of
             two noisy rates
  framework_keras_bn  "framework" with Keras' own BatchNormalization ops (model.fused_batchnorm=False), when the
             model has BatchNorm layers the framework fuses: what the loop alone gains
The framework contenders run the model as a run does (loops.modeling.configure_batchnorm: fused BatchNorm by
default); keras_fit and bare_loop run it as Keras does.
Warm-up calls (tracing) are not timed; every figure is the median of --windows timed windows, interleaved
in rounds (a, b, c, then b, c, a, ...: each takes every place in turn) so machine noise hits all alike; the
*_paired ratios are medians of the per-round ratios.
Also measures the machine's float32 matmul peak and the model's training FLOPs per image (TF profiler) to report
the fraction of peak reached.
"""

import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, as for main.py.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
_WINDOWS = flags.DEFINE_integer("windows", 3, "Timed windows per contender (median reported).")
_WINDOW_CALLS = flags.DEFINE_integer("window_calls", 5, "Calls of train.steps_per_loop steps per window.")
_LEVERS = flags.DEFINE_bool("levers", False, "Also time variants of the framework's loop (see benchmarks/README.md).")
_CONTENDERS = flags.DEFINE_list("contenders", None, "Time only these contenders (e.g. framework,synthetic: more "
                                "windows per pair in the same time); default: all. Ratios need both sides.")
flags.mark_flags_as_required(["config"])


def gemm_peak_gflops(tf, n=2048, repeats=10):
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


def training_gflops_per_image(tf, model, loss_fn, input_shape, batch=8):
  """Float operations of one forward + backward pass, from the TF profiler, per image."""
  from tensorflow.python.profiler import model_analyzer
  from tensorflow.python.profiler import option_builder

  @tf.function
  def grads(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(loss_fn(y, tf.cast(model(x, training=True), tf.float32)))
    return tape.gradient(loss, model.trainable_variables)

  graph = grads.get_concrete_function(tf.TensorSpec([batch, *input_shape]), tf.TensorSpec([batch], tf.int64)).graph
  options = option_builder.ProfileOptionBuilder(
      option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build()
  stats = model_analyzer.profile(graph, options=options)
  return stats.total_float_ops / batch / 1e9


class Nothing:
  """A metric that does nothing (the no-metrics lever)."""

  def update_state(self, *args, **kwargs):
    pass


class OneBatch:
  """For make_resident_train_fn: every step trains on the same preprocessed batch, each replica its share of it,
  sliced once per call (per step: no gather, no augmentation, no op at all: the loop's upper bound)."""

  steps_per_block = 1 << 30

  def __init__(self, batch, replicas):
    import tensorflow as tf
    self.tf, self.images, self.labels = tf, tf.constant(batch[0]), tf.constant(batch[1])
    self.per_replica = len(batch[1]) // replicas

  def call_indices(self, first_step, num_steps):
    return self.tf.zeros([num_steps])

  def replica_block(self, rows, first_step):
    start = self.tf.distribute.get_replica_context().replica_id_in_sync_group * self.per_replica
    return self.images[start:start + self.per_replica], self.labels[start:start + self.per_replica]

  def step_batch(self, block, i):
    return block


def paired_ratio(seconds, a, b):
  """Rate of `a` / rate of `b` as the median over rounds of the ratio of their windows in the same round (windows
  run a, b, c, ... in turn, so a slow spell of the machine hits both sides of a round alike)."""
  return statistics.median(tb / ta for ta, tb in zip(seconds[a], seconds[b]))


CONTENDERS = ("framework", "keras_fit", "bare_loop", "synthetic", "host_pipeline", "input_only", "framework_keras_bn")
# name: (numerator, denominator, paired); reported when both contenders ran.
RATIOS = {
    "ratio_vs_keras_fit": ("framework", "keras_fit", False),
    "ratio_vs_bare_loop": ("framework", "bare_loop", False),
    "ratio_real_vs_synthetic": ("framework", "synthetic", False),
    "ratio_host_pipeline_vs_synthetic": ("host_pipeline", "synthetic", False),
    "input_share_of_step": ("framework", "input_only", False),
    "ratio_real_vs_synthetic_paired": ("framework", "synthetic", True),
    "ratio_vs_keras_fit_paired": ("framework", "keras_fit", True),
    "ratio_keras_bn_vs_keras_fit": ("framework_keras_bn", "keras_fit", False),
    "ratio_fused_vs_keras_bn": ("framework", "framework_keras_bn", False),
}


def ratios(rates, seconds):
  """Every ratio of RATIOS whose two contenders ran, and each lever's rate / the framework's."""
  found = {name: paired_ratio(seconds, a, b) if paired else rates[a] / rates[b]
           for name, (a, b, paired) in RATIOS.items() if a in rates and b in rates}
  found.update({f"ratio_{name}": rates[name] / rates["framework"] for name in rates if name.startswith("lever_")})
  return found


def EpochTimer(keras):
  class Timer(keras.callbacks.Callback):
    seconds = None

    def on_epoch_begin(self, epoch, logs=None):
      self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
      self.seconds = time.perf_counter() - self._started

  return Timer()


def main(argv):
  del argv
  config = _CONFIG.value
  if _CONTENDERS.value and ("framework" not in _CONTENDERS.value or set(_CONTENDERS.value) - set(CONTENDERS)):
    raise SystemExit(f"--contenders must include framework and name only {','.join(CONTENDERS)}; "
                     f"got {','.join(_CONTENDERS.value)}")
  import keras
  import numpy as np
  import tensorflow as tf

  import data
  from data import resident as resident_lib
  from loops import cluster, fused_batchnorm, losses, modeling, optimizers, plan as plan_lib, steps
  from loops import strategy as strategy_lib

  strategy_lib.configure_devices(config)
  strategy = strategy_lib.build(config, cluster.Task())
  keras.utils.set_random_seed(config.seed)
  source = data.load(config.data)
  plan = plan_lib.derive(config, strategy.num_replicas_in_sync, source.train_size)
  input_shape = data.output_shape(source, config.data)
  loss_fn = losses.build(config.loss)
  k = plan.steps_per_loop
  steps_per_window = k * _WINDOW_CALLS.value

  def real_dataset():
    return data.train_dataset(source, config.data, batch_size=plan.global_batch_size,
                              steps_per_epoch=plan.steps_per_epoch, seed=config.seed)

  def fresh_model(policy=None, batchnorm=None):
    """A copy of the reference weights; `batchnorm`: a model config whose BatchNorm choices apply (a run's)."""
    with strategy.scope():
      if policy:  # the same weights in a model built under a mixed-precision policy
        previous = keras.mixed_precision.dtype_policy()
        keras.mixed_precision.set_dtype_policy(policy)
        try:
          model = models.build(config.model.name, input_shape, source.num_classes)
        finally:
          keras.mixed_precision.set_dtype_policy(previous)
      else:
        model = keras.models.clone_model(reference)
      model.set_weights(reference.get_weights())
      if batchnorm is not None:
        modeling.configure_batchnorm(model, batchnorm)
      optimizer = optimizers.build(config.optimizer, plan.learning_rate)
      optimizer.build(model.trainable_variables)
    return model, optimizer

  import models
  with strategy.scope():
    reference = models.build(config.model.name, input_shape, source.num_classes)

  # (a) the framework's loop and (d) the same loop on one batch repeated.
  def framework_runner(dataset, python_loop=False, with_metrics=True, policy=None, jit_compile=False,
                       resident=False, batchnorm=config.model):
    model, optimizer = fresh_model(policy, batchnorm)
    with strategy.scope():
      metrics = {"loss": keras.metrics.Mean(), "accuracy": keras.metrics.SparseCategoricalAccuracy()}
      counter = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    if not with_metrics:
      metrics = {"loss": Nothing(), "accuracy": Nothing()}
    step_fn = steps.make_train_step(model, optimizer, loss_fn, metrics, plan.global_batch_size, counter,
                                    jit_compile=jit_compile)
    if resident:  # the train split on the devices, each batch gathered there (data/resident.py), or one batch
      on_devices = OneBatch(one_batch, plan.replicas) if resident == "one_batch" else resident_lib.ResidentTrainData(
          strategy, source, config.data, seed=config.seed, global_batch_size=plan.global_batch_size,
          steps_per_epoch=plan.steps_per_epoch)
      resident_fn = steps.make_resident_train_fn(strategy, step_fn, counter, on_devices)
      train_fn = lambda _, calls: resident_fn(calls)  # noqa: E731
      iterator = None
    else:
      train_fn = steps.make_train_fn(strategy, step_fn, counter)
      iterator = iter(strategy.experimental_distribute_dataset(dataset))
    calls = tf.constant(1 if python_loop else k, tf.int32)
    repeats = k if python_loop else 1

    def window():
      for _ in range(_WINDOW_CALLS.value * repeats):
        loss = train_fn(iterator, calls)
      float(loss)  # one host sync per window, as the run does per summary interval
    return window

  # (e) the device-resident input alone: the same compiled loop and batches, a step that only reads its batch
  # (one pass over it, so nothing is pruned): what the real input adds to a step, measured with far less noise
  # than the difference of two step rates.
  def input_only_runner():
    with strategy.scope():
      counter = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    on_devices = resident_lib.ResidentTrainData(strategy, source, config.data, seed=config.seed,
                                                global_batch_size=plan.global_batch_size,
                                                steps_per_epoch=plan.steps_per_epoch)
    read_batch = lambda images, labels: tf.reduce_sum(images) + tf.reduce_sum(tf.cast(labels, tf.float32))  # noqa: E731
    input_fn = steps.make_resident_train_fn(strategy, read_batch, counter, on_devices)

    def window():
      for _ in range(_WINDOW_CALLS.value):
        total = input_fn(tf.constant(k, tf.int32))
      float(total)
    return window

  def with_options(dataset, threads=None, slack=False):
    """The input pipeline on tf.data's shared thread pool (threads=0), or with prefetch slack."""
    options = tf.data.Options()
    if threads == 0:
      options.threading.private_threadpool_size = 0
      options.threading.max_intra_op_parallelism = 0
    options.experimental_slack = slack
    return dataset.with_options(options)

  one_batch = next(iter(real_dataset()))

  # (b) Keras fit, steps_per_execution = k.
  def keras_runner():
    model, optimizer = fresh_model()
    with strategy.scope():
      model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"], steps_per_execution=k)
    dataset = real_dataset()
    timer = EpochTimer(keras)

    def window():  # timed from on_epoch_begin to on_epoch_end: fit's per-call set-up is not counted
      model.fit(dataset, epochs=1, steps_per_epoch=steps_per_window, verbose=0, callbacks=[timer])
      return timer.seconds
    return window

  # (c) the bare tutorial loop: one step per tf.function call.
  def bare_runner():
    model, optimizer = fresh_model()

    def step_fn(images, labels):
      with tf.GradientTape() as tape:
        logits = model(images, training=True)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=plan.global_batch_size)
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      return loss

    @tf.function
    def train_step(batch):
      return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=batch), axis=None)

    iterator = iter(strategy.experimental_distribute_dataset(real_dataset()))

    def window():
      for _ in range(steps_per_window):
        loss = train_step(next(iterator))
      float(loss)
    return window

  # "framework" is the input path a run with this config takes (device-resident when data/resident.py says so);
  # "host_pipeline" is the tf.data path, measured too when the framework's is resident.
  residency = resident_lib.decide(source, config.data, synchronous=True)
  runners = {"framework": framework_runner(real_dataset(), resident=residency.resident), "keras_fit": keras_runner(),
             "bare_loop": bare_runner(), "synthetic": framework_runner(None, resident="one_batch")}
  if residency.resident:
    runners["host_pipeline"] = framework_runner(real_dataset())
    runners["input_only"] = input_only_runner()
  keras_batchnorm = config.model.copy_and_resolve_references()
  keras_batchnorm.fused_batchnorm = False
  fused_layers = fused_batchnorm.fused_layers(fresh_model(batchnorm=config.model)[0])  # as the framework runs it
  if fused_layers:
    runners["framework_keras_bn"] = framework_runner(real_dataset(), resident=residency.resident,
                                                     batchnorm=keras_batchnorm)
  if _CONTENDERS.value:
    runners = {name: runner for name, runner in runners.items() if name in _CONTENDERS.value}
  if _LEVERS.value:
    runners["lever_python_loop"] = framework_runner(real_dataset(), python_loop=True)
    runners["lever_no_metrics"] = framework_runner(real_dataset(), with_metrics=False)
    runners["lever_pipeline_shared_threads"] = framework_runner(with_options(real_dataset(), threads=0))
    runners["lever_pipeline_slack"] = framework_runner(with_options(real_dataset(), slack=True))
    runners["lever_bfloat16"] = framework_runner(real_dataset(), policy="mixed_bfloat16")
    runners["lever_xla"] = framework_runner(real_dataset(), jit_compile=True)
  for window in runners.values():  # warm-up: tracing and pipeline start-up, not timed
    window()
  seconds = {name: [] for name in runners}
  names = list(runners)
  for round_index in range(_WINDOWS.value):
    shift = round_index % len(names)  # each contender takes every place in a round in turn: no place bias
    for name in names[shift:] + names[:shift]:
      window = runners[name]
      started = time.perf_counter()
      own_timing = window()
      seconds[name].append(own_timing if own_timing is not None else time.perf_counter() - started)
  images = steps_per_window * plan.global_batch_size
  rates = {name: images / statistics.median(times) for name, times in seconds.items()}
  peak = gemm_peak_gflops(tf)
  per_image = training_gflops_per_image(tf, reference, loss_fn, input_shape)
  results = {
      "images_per_sec": rates,
      **ratios(rates, seconds),
      "device_resident": residency.resident,
      "device_resident_reason": residency.reason,
      "fused_batchnorm_layers": fused_layers,
      "gemm_peak_gflops": peak,
      "model_gflops_per_image": per_image,
      "fraction_of_peak": rates["framework"] * per_image / peak,
      "window_seconds": seconds,
      "steps_per_window": steps_per_window,
      "config": json.loads(config.to_json_best_effort()),
      "replicas": plan.replicas,
      "global_batch_size": plan.global_batch_size,
      "steps_per_loop": k,
      "versions": {"tensorflow": tf.__version__, "keras": keras.__version__, "python": platform.python_version(),
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores"},
      "date": time.strftime("%Y-%m-%d"),
  }
  print(f"{'contender':<20}{'images/s':>12}   (median of {_WINDOWS.value} windows of {steps_per_window} steps, "
        f"batch {plan.global_batch_size}, {plan.replicas} replica(s), {config.model.name})")
  for name, rate in rates.items():
    print(f"{name:<20}{rate:>12.0f}")
  print(f"train input: {'device-resident' if residency.resident else 'host pipeline'} ({residency.reason})")
  for key in [*ratios(rates, seconds), "gemm_peak_gflops", "model_gflops_per_image", "fraction_of_peak"]:
    if not key.startswith("ratio_lever_"):
      print(f"{key:<34}{results[key]:.4g}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(results, f, indent=2)
  return 0


if __name__ == "__main__":
  app.run(main)
