"""Every rule of a run, each checked once, here, before anything is trained or written (runs and --dry_run alike).

Four stages, as the facts they need appear (each raises ConfigError: one line, what is wrong, what is valid):
  check(config)                          every setting on its own; no TensorFlow state (imports the registries)
  check_task(config, task)               the strategy against the cluster and the machine's devices
  check_derived(config, plan, source)    what needs the replica count and the data: batch splits, epochs, warmup,
                                         channels; then, once built, check_metric_references, check_model_outputs,
                                         check_callbacks
Code deeper down does not re-check what is checked here.
"""

import re

import data
from data import mixing
from data import resident
from data import sources
from errors import ConfigError, unknown_name
from loops.core import plugins
from loops.core.interfaces import HOOKS
from loops.distribute import cluster
from loops.distribute import parameter_server
from loops.distribute import steps
from loops.distribute import strategy as strategy_lib
from loops.model import losses
from loops.model import metrics as metrics_lib
from loops.model import model as model_lib
from loops.model import optimizers
from loops.persist import preemption
from loops.task import checks as task_checks

MIXED_PRECISION = (None, "bfloat16", "float16")
PROGRESS_BAR = ("auto", "on", "off")
MODES = ("min", "max")
NAN_POLICIES = ("stop", "rollback")


def check(config):
  """Checks every setting on its own.

  Args:
    config: the resolved ml_collections config (after command-line overrides).

  Raises:
    ConfigError: for the first bad setting (one line: what is wrong, what is valid).
  """
  _check_machine(config)
  _check_data(config.data)
  _check_model_and_loss(config)
  _check_optimizer(config.optimizer)
  _check_train(config.train)
  _check_init(config.init, config.train)
  _check_cadence(config)
  _check_outputs(config)
  task_checks.check_task_settings(config)
  tags = _check_metric_names(tuple(config.eval.metrics))
  if tags is not None and config.task.name == task_checks.BUILT_IN:  # only known here when every metric is a registry name; else checked once built
    check_metric_references(config, tags)
  _check_callbacks(config.callbacks)


check_models = task_checks.check_models
check_optimizers = task_checks.check_optimizers


def check_metric_references(config, tags):
  """checkpoint.best_metric and early_stopping.metric must name one of the run's eval results (or be "")."""
  for key, name in (("checkpoint.best_metric", config.checkpoint.best_metric),
                    ("early_stopping.metric", config.early_stopping.metric)):
    if name and name not in tags:
      raise ConfigError(f"{key} '{name}' is not an eval metric of this run; valid: {', '.join(tags)} or '' (off)"
                        f" (eval.metrics adds more)")


def _one_of(key, value, valid):
  if value not in valid:
    raise unknown_name(key, value, valid)


def _at_least(key, value, low, what="an integer"):
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise ConfigError(f"{key} must be {what} >= {low}, got {value!r}")


MODES_OF_RUN = ("train", "evaluate")


def _check_machine(config):
  _one_of("mode", config.mode, MODES_OF_RUN)
  for key in ("eval.sidecar_poll_seconds", "eval.sidecar_timeout_seconds"):
    if not config.eval[key.split(".")[1]] > 0:
      raise ConfigError(f"{key} must be > 0, got {config.eval[key.split('.')[1]]}")
  _one_of("strategy", config.strategy, strategy_lib.STRATEGIES)
  for key in ("cpu_replicas", "intra_op_threads", "inter_op_threads"):
    _at_least(key, config[key], 0)
  if config.num_gpus is not None:
    _at_least("num_gpus", config.num_gpus, 0, "None (all) or an integer")
  _one_of("cluster.source", config.cluster.source, cluster.SOURCES)
  _one_of("cluster.collective", config.cluster.collective, strategy_lib.COLLECTIVES)
  _at_least("cluster.bytes_per_pack", config.cluster.bytes_per_pack, 0, "a number of bytes (0 = one pack)")
  timeout = config.cluster.collective_timeout_seconds
  if timeout is not None and not timeout > 0:
    raise ConfigError(f"cluster.collective_timeout_seconds must be > 0 or None (wait forever), got {timeout}")
  if not config.cluster.startup_timeout_seconds > 0:
    raise ConfigError(f"cluster.startup_timeout_seconds must be > 0, got {config.cluster.startup_timeout_seconds}")
  if not isinstance(config.resume.accept_changes, bool):
    raise ConfigError(f"resume.accept_changes must be True or False, got {config.resume.accept_changes!r}")
  preemption.signal_numbers(config.preemption.signals)
  code = config.preemption.exit_code
  if not isinstance(code, int) or isinstance(code, bool) or not 2 <= code <= 255:
    raise ConfigError(f"preemption.exit_code must be an integer in 2..255 (1 is a user error), got {code!r}; "
                      "143 is what Kubernetes (TFJob restartPolicy ExitCode) and GCE restart")
  if config.strategy in strategy_lib.MULTI_WORKER and config.cpu_replicas:
    raise ConfigError("cpu_replicas applies to one machine (mirrored, central_storage); with "
                      "multi_worker_mirrored each worker has one CPU replica or all its GPUs")
  if config.nan_policy.mode == "rollback" and not strategy_lib.can_rewind_input(config.strategy):
    raise ConfigError(f"nan_policy.mode='rollback' is not available with {config.strategy} (its per-worker "
                      "datasets cannot be rewound); use 'stop'")


def _check_data(d):
  sources.resolve(d.name)
  _one_of("data.corrupt_images", d.corrupt_images, sources.CORRUPT_IMAGE_POLICIES)
  _one_of("data.device_resident", d.device_resident, resident.CHOICES)
  _at_least("data.device_resident_max_bytes", d.device_resident_max_bytes, 0, "a number of bytes")
  if d.name == "npz":
    _check_npz_settings(d)
  if d.name == "image_folder" and not d.data_dir:
    raise ConfigError("data.name='image_folder' needs data.data_dir=ROOT holding ROOT/<split>/<class>/<images>")
  if d.name == "tfrecord":
    _check_tfrecord_settings(d)
  shape = tuple(d.synthetic.image_shape)
  if d.name == "synthetic" and (len(shape) != 3 or min(shape) < 1):
    raise ConfigError(f"data.synthetic.image_shape must be (height, width, channels), got {shape}")
  if d.image_size is not None:
    _at_least("data.image_size", d.image_size, 1, "None (keep) or a number of pixels")
  if (d.mean is None) != (d.std is None) or (d.mean is not None and len(d.mean) != len(d.std)):
    raise ConfigError(f"data.mean and data.std must be set together with one value per channel (or both None), "
                      f"got {d.mean} and {d.std}")
  if d.std is not None and not all(s > 0 for s in d.std):
    raise ConfigError(f"data.std values must be > 0, got {d.std}")
  for name in ("mixup_alpha", "cutmix_alpha"):
    if not d[name] >= 0:
      raise ConfigError(f"data.{name} must be >= 0 (0 = off; typical 0.2 for mixup, 1.0 for cutmix), got {d[name]}")
  if d.pipeline_threads is not None:
    _at_least("data.pipeline_threads", d.pipeline_threads, 0, "None (auto), 0 (tf.data's pool) or")
  _at_least("data.shuffle_window", d.shuffle_window, 1)
  _at_least("data.streams", d.streams, 1)
  if d.service and not d.service.startswith(("grpc://", "grpc+loas://")):
    raise ConfigError(f"data.service must be '' (off) or a dispatcher address grpc://HOST:PORT, got '{d.service}'")
  if not (isinstance(d.service_timeout_seconds, (int, float)) and d.service_timeout_seconds > 0):
    raise ConfigError(f"data.service_timeout_seconds must be a number of seconds > 0, got {d.service_timeout_seconds!r}")


def _check_tfrecord_settings(d):
  if not d.data_dir:
    raise ConfigError("data.name='tfrecord' needs data.data_dir: a directory written by `python -m data.prepare`, or "
                      "a glob of TFRecord files with {split} for the split name (e.g. /data/imagenet/{split}-*)")
  shape = d.tfrecord.image_shape
  if shape is not None and (len(shape) != 3 or min(shape) < 1):
    raise ConfigError(f"data.tfrecord.image_shape must be None or (height, width, channels), got {tuple(shape)}")
  if d.tfrecord.num_classes is not None:
    _at_least("data.tfrecord.num_classes", d.tfrecord.num_classes, 1, "None (from the manifest) or")


def _check_model_and_loss(config):
  _check_model(config.model)
  if plugins.is_import_path(config.loss.name):
    plugins.load_callable(config.loss.name, "loss.name", 2, losses.EXTRA)
  else:
    _one_of("loss", config.loss.name, list(losses.LOSSES) + ["package.module:function"])
  if not 0.0 <= config.loss.label_smoothing < 1.0:
    raise ConfigError(f"loss.label_smoothing must be in [0, 1), got {config.loss.label_smoothing}")
  _one_of("mixed_precision", config.mixed_precision, MIXED_PRECISION)


def _check_model(model_config):
  """model.name resolves and model.kwargs fit its signature; no TensorFlow state."""
  fn = model_lib.model_function(model_config.name)
  plugins.check_call(fn, ((1, 1, 1), 2), dict(model_config.kwargs), "model.kwargs", model_config.name)


def _check_npz_settings(data_config):
  """data.data_dir names an .npz file and both split names can be array-name suffixes."""
  if not (data_config.data_dir or "").endswith(".npz"):
    raise ConfigError(f"data.name='npz' needs data.data_dir=PATH.npz (a local or tf.io.gfile path of an .npz "
                      f"holding {sources.NPZ_KEYS}), got {data_config.data_dir!r}")
  for key in ("train_split", "eval_split"):
    if not re.fullmatch(r"\w+", data_config[key]):
      raise ConfigError(f"data.{key}='{data_config[key]}' cannot name an npz split: split S reads the arrays x_S "
                        f"and y_S (train, test, or any other suffix the file has)")


def _check_metric_names(names):
  """Checks every entry of eval.metrics without creating a metric; returns the known result tags (eval/...),
  or None when an import-path metric names itself only once built."""
  if isinstance(names, str) or not all(isinstance(name, str) for name in names):
    raise ConfigError(f"eval.metrics must be a tuple of names, got {names!r}")
  tags, complete = [f"eval/{metrics_lib.LOSS}"], True
  for name in names:
    if plugins.is_import_path(name):
      plugins.load_callable(name, "eval.metrics", 0)
      complete = False
    elif name not in metrics_lib.METRICS:
      raise unknown_name("eval metric", name, list(metrics_lib.METRICS) + ["package.module:factory"])
    else:
      tags.append(f"eval/{name}")
  return tags if complete else None


def _check_optimizer(o):
  _one_of("optimizer", o.name, optimizers.OPTIMIZERS)
  _one_of("optimizer.lr_scaling rule", o.lr_scaling, optimizers.LR_SCALING)
  _one_of("optimizer.schedule", o.schedule, optimizers.SCHEDULES)
  if not o.learning_rate > 0:
    raise ConfigError(f"optimizer.learning_rate must be > 0, got {o.learning_rate}")
  if o.warmup_epochs < 0 or o.momentum < 0:
    raise ConfigError(f"optimizer.warmup_epochs and optimizer.momentum must be >= 0, got {o.warmup_epochs} and "
                      f"{o.momentum}")
  if not 0.0 <= o.ema_decay < 1.0:
    raise ConfigError(f"optimizer.ema_decay must be in [0, 1) (0 = off; e.g. 0.999), got {o.ema_decay}")
  epochs = list(o.decay_epochs)
  if o.schedule == "piecewise" and (not epochs or epochs != sorted(epochs) or epochs[0] <= 0):
    raise ConfigError(f"optimizer.schedule='piecewise' needs optimizer.decay_epochs in increasing order (> 0), "
                      f"got {tuple(epochs)}")


def _check_train(t):
  if t.global_batch_size is None and t.per_replica_batch_size is None:
    raise ConfigError("set train.global_batch_size (or train.per_replica_batch_size)")
  for key in ("global_batch_size", "per_replica_batch_size"):
    if t[key] is not None:
      _at_least(f"train.{key}", t[key], 1)
  if t.steps is not None and t.steps < 1:
    raise ConfigError(f"train.steps must be >= 1 (or None to use train.epochs), got {t.steps}")
  if t.steps is None and not (t.epochs or 0) > 0:
    raise ConfigError(f"set train.steps or train.epochs (> 0); got steps=None, epochs={t.epochs}")
  if not isinstance(t.steps_per_loop, int) or t.steps_per_loop < 1:
    raise ConfigError(f"train.steps_per_loop must be a positive integer, got {t.steps_per_loop!r}")
  _at_least("train.grad_accum_steps", t.grad_accum_steps, 1, "a positive integer")


def _check_init(init, train):
  """init.* and train.freeze: valid regular expressions, a fraction, a source of a kind that can be read."""
  for key, patterns in (("init.exclude", init.exclude), ("train.freeze", train.freeze)):
    if isinstance(patterns, str):
      raise ConfigError(f"{key} must be a tuple of regular expressions, e.g. ('{patterns}',); got a string")
    for pattern in patterns:
      try:
        re.compile(pattern)
      except (re.error, TypeError) as e:
        raise ConfigError(f"{key} pattern {pattern!r} is not a regular expression: {e}") from None
  if not isinstance(init.min_fraction, (int, float)) or not 0.0 <= init.min_fraction <= 1.0:
    raise ConfigError(f"init.min_fraction must be a number in [0, 1], got {init.min_fraction!r}")
  if init.optimizer_state and (init.checkpoint.endswith(".keras") or init.checkpoint.endswith(".h5")):
    raise ConfigError(f"init.optimizer_state needs a checkpoint (a workdir or .../ckpt-N), not the Keras file "
                      f"'{init.checkpoint}'")


def _check_cadence(config):
  for key, value in (("eval.every_steps", config.eval.every_steps),
                     ("checkpoint.every_steps", config.checkpoint.every_steps),
                     ("summary.histogram_every_steps", config.summary.histogram_every_steps)):
    _at_least(key, value, 0, "0 (only at the end / off) or a number of steps:")
  _at_least("checkpoint.keep", config.checkpoint.keep, 1)
  _one_of("nan_policy.mode", config.nan_policy.mode, NAN_POLICIES)
  _at_least("nan_policy.max_retries", config.nan_policy.max_retries, 0)
  profile = tuple(config.summary.profile_steps)
  if profile and (len(profile) != 2 or not 0 <= profile[0] < profile[1]):
    raise ConfigError(f"summary.profile_steps must be (first, last) with 0 <= first < last, or (), got {profile}")
  fraction = config.summary.straggler_fraction
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not fraction >= 0:
    raise ConfigError(f"summary.straggler_fraction must be 0 (off) or a fraction >= 0 (0.2 = 20 % slower than the "
                      f"median worker), got {fraction!r}")
  _at_least("summary.straggler_calls", config.summary.straggler_calls, 1)
  stopping = config.early_stopping
  _one_of("early_stopping.mode", stopping.mode, MODES)
  _at_least("early_stopping.patience", stopping.patience, 1)
  if not stopping.min_delta >= 0:
    raise ConfigError(f"early_stopping.min_delta must be >= 0, got {stopping.min_delta}")


def _check_outputs(config):
  _one_of("checkpoint.best_mode", config.checkpoint.best_mode, MODES)
  _one_of("summary.progress_bar", config.summary.progress_bar, PROGRESS_BAR)
  for key, name in (("checkpoint.best_metric", config.checkpoint.best_metric),
                    ("early_stopping.metric", config.early_stopping.metric)):
    if name and not name.startswith("eval/"):
      raise ConfigError(f"{key} must be '' (off) or an eval result 'eval/<metric name>', got '{name}'")


def _check_callbacks(names):
  if isinstance(names, str) or not all(isinstance(name, str) for name in names):
    raise ConfigError(f"callbacks must be a tuple of 'package.module:factory' strings, got {names!r}")
  for name in names:
    plugins.load_callable(name, "callbacks", 1)


def check_task(config, task):
  """The strategy against this process's task (loops/distribute/cluster.py) and the machine's devices.

  Args:
    config: the checked config.
    task: this process's cluster.ClusterTask.

  Raises:
    ConfigError: a strategy the cluster cannot run, or more GPUs asked for than the machine has.
  """
  name = config.strategy
  if task.is_evaluator:
    pass  # an evaluator evaluates on its own devices, whatever the training cluster runs
  elif name in strategy_lib.MULTI_WORKER and not task.is_distributed:
    raise ConfigError("strategy 'multi_worker_mirrored' needs a cluster: set TF_CONFIG, run under srun, or start "
                      "it with `python -m launch.local --workers N -- python main.py ...`")
  elif name in strategy_lib.ASYNCHRONOUS:
    parameter_server.check_cluster(task)
  elif name not in strategy_lib.MULTI_WORKER and name != "tpu" and task.is_distributed and task.num_workers > 1:
    raise ConfigError(f"strategy '{name}' runs on one machine, but this process is task {task.type}:{task.index} "
                      f"of a {task.num_workers}-worker cluster; use multi_worker_mirrored (or unset TF_CONFIG)")
  gpus = strategy_lib.gpu_count()
  if config.num_gpus is not None and not config.num_gpus <= gpus:
    raise ConfigError(f"num_gpus={config.num_gpus} but this machine has {gpus} GPU(s); valid: 0..{gpus} or None (all)")


def check_derived(config, plan, source):
  """What needs the replica count and the data: the batch split, at least one step per epoch, the warmup's
  length, the normalisation's channels.

  Args:
    config: the checked config.
    plan: plan.derive's values (loops/plan.py), which are computed without checks.
    source: the loaded data.Source.

  Raises:
    ConfigError: for the first value that cannot work.
  """
  global_batch = plan.global_batch_size
  for parts, what in ((plan.replicas, "replicas"), (plan.input_pipelines, "input pipelines")):
    if global_batch % parts:
      raise ConfigError(f"global batch size {global_batch} is not divisible by the {parts} {what}; "
                        f"use a multiple of {parts}")
  if plan.per_replica_batch_size % plan.grad_accum_steps:
    raise ConfigError(f"train.grad_accum_steps={plan.grad_accum_steps} must be a positive integer dividing the "
                      f"per-replica batch ({plan.per_replica_batch_size})")
  if source.train_files is not None:
    _check_streams(config.data, plan, source)
  if plan.steps_per_epoch < 1:
    raise ConfigError(f"dataset '{source.name}' has {source.train_size} train examples: fewer than one global "
                      f"batch of {global_batch}")
  warmup = optimizers.warmup_steps(config.optimizer, plan.steps_per_epoch)
  if warmup > 0 and warmup >= plan.total_steps:
    raise ConfigError(f"optimizer.warmup_epochs={config.optimizer.warmup_epochs} gives {warmup} warmup steps; it "
                      f"must be shorter than the run ({plan.total_steps} steps)")
  if source.image_shape is None:
    _check_array_source(config.data, source)
    return
  channels, mean = source.image_shape[-1], config.data.mean
  if mean is not None and len(mean) != channels:
    raise ConfigError(f"data.mean and data.std need {channels} values (one per channel of dataset "
                      f"'{source.name}'), got {len(mean)}")


def _check_array_source(d, source):
  """A user's arrays are fed as they are: the image settings would silently do nothing."""
  for key, value in (("data.image_size", d.image_size), ("data.mean", d.mean), ("data.random_flip", d.random_flip),
                     ("data.mixup_alpha", d.mixup_alpha), ("data.cutmix_alpha", d.cutmix_alpha)):
    if value:
      raise ConfigError(f"{key}={value!r} is an image setting; dataset '{source.name}' is a user's arrays, fed as "
                        f"they are (preprocess them in your function, or unset {key})")


def check_metrics(made, names):
  """What the eval metric factories returned: keras Metrics with names of their own.

  Args:
    made: [(eval.metrics entry, metric)] from loops/model/metrics.py's build.
    names: config.eval.metrics, for the message.
  """
  import keras
  seen = set()
  for entry, metric in made:
    if not isinstance(metric, keras.metrics.Metric):
      raise ConfigError(f"eval.metrics entry '{entry}' returned {type(metric).__name__}, not a keras.metrics.Metric")
    if metric.name in seen:
      raise ConfigError(f"two eval metrics are named '{metric.name}' (eval.metrics={tuple(names)}); "
                        f"give each its own name")
    seen.add(metric.name)
    if entry != metrics_lib.LOSS:  # the loss mean is the run's own, updated with the per-example losses
      _check_update_state(entry, metric)


def _check_update_state(entry, metric):
  """The run calls update_state(labels, logits, sample_weight=weights): a metric that cannot take that call fails
  here, before anything is trained, naming its file and line."""
  import inspect
  update = metric.update_state
  try:
    inspect.signature(update).bind(None, None, sample_weight=None)
  except TypeError:
    code = getattr(getattr(type(metric), "update_state", None), "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
    raise ConfigError(f"eval.metrics entry '{entry}': {type(metric).__name__}.update_state{inspect.signature(update)}"
                      f"{where} must take (labels, logits, sample_weight=None)") from None
  except ValueError:  # no signature to read
    pass


def _check_streams(data_config, plan, source):
  """Record files read as data.streams streams (data/records.py): whole shares per step, whole streams per
  worker, a file for every stream, and mixes of the whole global batch only where one pipeline reads it."""
  streams, files = data_config.streams, len(source.train_files.paths)
  if plan.global_batch_size % streams:
    raise ConfigError(f"data.streams={streams} must divide the global batch ({plan.global_batch_size}): each step "
                      f"takes the same number of records from every stream")
  if streams % plan.input_pipelines:
    raise ConfigError(f"data.streams={streams} must be a multiple of the {plan.input_pipelines} workers (each "
                      f"reads whole streams); e.g. {plan.input_pipelines * max(1, streams // plan.input_pipelines)}")
  if files < streams:
    raise ConfigError(f"dataset '{source.name}' has {files} train file(s), fewer than data.streams={streams}; "
                      f"set data.streams <= {files} or prepare more shards")
  if plan.input_pipelines > 1 and mixing.mixes(data_config):
    raise ConfigError("mixup/cutmix mix examples of the whole global batch, which no worker reads when streamed "
                      "record files are split over workers; hold the data in memory (data.in_memory=True) or "
                      "turn mixup/cutmix off")


def check_model_outputs(loss_fn, model, input_shape, num_classes, soft_labels=False, batch=4):
  """Calls the model and the loss eagerly on a zero batch (labels as the pipeline will give them), so a model
  output without logits or a reduced loss fails here with its own message, not inside a trace."""
  import tensorflow as tf
  images = tf.zeros([batch, *input_shape], tf.float32)
  logits, outputs = steps.forward(model, images, training=False)
  labels = tf.fill([batch, num_classes], 1.0 / num_classes) if soft_labels else tf.zeros([batch], tf.int64)
  loss_fn(labels, logits, images=images, outputs=outputs, step=tf.constant(0, tf.int64))


def check_callbacks(named):
  """Every callback has some of the hooks, each a method taking one argument (the State).

  Args:
    named: [(name, callback)] as loops.callbacks.load_user makes them.
  """
  for name, callback in named:
    hooks = [hook for hook in HOOKS if hasattr(callback, hook)]
    if not hooks:
      raise ConfigError(f"callback '{name}' ({type(callback).__name__}) has none of the methods {', '.join(HOOKS)}")
    for hook in hooks:
      method = getattr(callback, hook)
      if not callable(method) or not plugins.accepts(method, 1):
        raise ConfigError(f"callback '{name}': {hook} must be a method taking one argument (state)")


FINDERS = ("lr", "batch_size")


def check_finder(config, what, has_gpu):
  """The find.* settings of one finder (`--find=lr|batch_size`, loops/finders/) and the strategy it runs on.

  Raises:
    ConfigError: a bad bound, step count, factor or budget (one line), or a strategy the finder cannot use.
  """
  _one_of("--find", what, FINDERS)
  f = config.find
  if config.strategy in strategy_lib.ASYNCHRONOUS:
    raise ConfigError(f"--find={what} needs a synchronous strategy (one_device, mirrored, multi_worker_mirrored, "
                      "central_storage), not parameter_server")
  if what == "lr":
    if not 0 < f.lr_min < f.lr_max:
      raise ConfigError(f"find.lr_min and find.lr_max must satisfy 0 < lr_min < lr_max, got {f.lr_min}, {f.lr_max}")
    _at_least("find.lr_steps", f.lr_steps, 10)
    if not 0 <= f.smoothing < 1 or not f.diverge_factor > 1:
      raise ConfigError(f"find.smoothing must be in [0, 1) and find.diverge_factor > 1, got {f.smoothing} and "
                        f"{f.diverge_factor}")
    return
  if config.strategy in strategy_lib.MULTI_WORKER:
    raise ConfigError("--find=batch_size measures one machine: run it with strategy one_device or mirrored (the "
                      "per-replica batch that fits a device is the same under multi_worker_mirrored)")
  _at_least("find.granularity", f.granularity, 1)
  _at_least("find.max_per_replica_batch", f.max_per_replica_batch, f.granularity)
  _at_least("find.timed_steps", f.timed_steps, 1)
  if not has_gpu and not (f.memory_budget_gb or 0) > 0:
    raise ConfigError("--find=batch_size on a machine without GPU needs a memory budget: CPUs do not fail cleanly "
                      f"when memory runs out; set --config.find.memory_budget_gb=GB (> 0), got {f.memory_budget_gb}")
