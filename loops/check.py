"""check(config): every setting, before anything is built, trained or written; used by runs and by --dry_run.

Creates no TensorFlow state (it only imports the registries). What needs the replica count or the dataset
(batch divisibility, steps per epoch, warmup vs run length, channel counts) is checked where it is derived, still
before anything is written.
"""

import data
from data import resident
from data import sources
from loops import checkpoints as checkpoints_lib
from loops import cluster
from loops import losses
from loops import metrics as metrics_lib
from loops import modeling
from loops import optimizers
from loops import plugins
from loops import strategy as strategy_lib
from loops.errors import ConfigError, unknown_name

MIXED_PRECISION = (None, "bfloat16", "float16")
PROGRESS_BAR = ("auto", "on", "off")
MODES = ("min", "max")
NAN_POLICIES = ("stop", "rollback")


def check(config):
  """Raises ConfigError (one line: what is wrong, what is valid) for the first bad setting."""
  _check_machine(config)
  _check_data(config.data)
  _check_model_and_loss(config)
  _check_optimizer(config.optimizer)
  _check_train(config.train)
  _check_cadence(config)
  _check_outputs(config)
  tags = metrics_lib.check_names(tuple(config.eval.metrics))
  if tags is not None:  # only known here when every metric is a registry name; else checked once built
    check_metric_references(config, tags)
  _check_callbacks(config.callbacks)


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
  checkpoints_lib.signal_numbers(config.preemption.signals)
  code = config.preemption.exit_code
  if not isinstance(code, int) or isinstance(code, bool) or not 2 <= code <= 255:
    raise ConfigError(f"preemption.exit_code must be an integer in 2..255 (1 is a user error), got {code!r}; "
                      "143 is what Kubernetes (TFJob restartPolicy ExitCode) and GCE restart")
  if config.nan_policy.mode == "rollback" and not strategy_lib.can_rewind_input(config.strategy):
    raise ConfigError(f"nan_policy.mode='rollback' is not available with {config.strategy} (its per-worker "
                      "datasets cannot be rewound); use 'stop'")


def _check_data(d):
  if not d.name.startswith(sources.TFDS_PREFIX):
    _one_of("dataset", d.name, list(data.SOURCES) + [sources.TFDS_PREFIX + "<tfds name>"])
  _one_of("data.corrupt_images", d.corrupt_images, sources.CORRUPT_IMAGE_POLICIES)
  _one_of("data.device_resident", d.device_resident, resident.CHOICES)
  _at_least("data.device_resident_max_bytes", d.device_resident_max_bytes, 0, "a number of bytes")
  if d.name == "npz":
    sources.check_npz_settings(d)
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
  _at_least("data.shuffle_buffer", d.shuffle_buffer, 1)


def _check_model_and_loss(config):
  modeling.check(config.model)
  if plugins.is_import_path(config.loss.name):
    plugins.load_callable(config.loss.name, "loss.name", 2, losses.EXTRA)
  else:
    _one_of("loss", config.loss.name, list(losses.LOSSES) + ["package.module:function"])
  if not 0.0 <= config.loss.label_smoothing < 1.0:
    raise ConfigError(f"loss.label_smoothing must be in [0, 1), got {config.loss.label_smoothing}")
  _one_of("mixed_precision", config.mixed_precision, MIXED_PRECISION)


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
