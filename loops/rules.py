"""Every rule of a run, in stages, before anything is trained or written (runs and --dry_run alike). The rules live
with what they check (data/rules.py, loops/modeling/rules.py, loops/distribute/rules.py, loops/task/rules.py,
loops/callbacks/rules.py, loops/finders/rules.py); this module runs them in order, plus the rules of the run
itself (length, cadence, outputs, resume and preemption). Each raises ConfigError: one line, what is wrong, what
is valid.

  check(config)                          every setting on its own; no TensorFlow state (imports the registries)
  check_role(config, role)               the strategy against the cluster and the machine's devices
  check_derived(config, plan, source)    what needs the replica count and the data: batch splits, epochs, warmup,
                                         channels; then, once built, check_metric_references, check_model_outputs,
                                         check_callbacks
Code deeper down does not re-check what is checked here.
"""

import re

from data import rules as data_rules
from errors import ConfigError, at_least, one_of
from loops.callbacks import rules as callback_rules
from loops.distribute import rules as distribute_rules
from loops.modeling import rules as model_rules
from loops.modeling import model as model_lib
from loops.modeling import optimizers
from loops.persist import preemption
from loops.persist import tracking
from loops.task import rules as task_rules

PROGRESS_BAR = ("auto", "on", "off")
MODES = ("min", "max")
NAN_POLICIES = ("stop", "rollback")
MODES_OF_RUN = ("train", "evaluate", "predict")

# The build-time stages, where their rules live.
check_role = distribute_rules.check_role
check_metrics = model_rules.check_metrics
check_model_outputs = task_rules.check_model_outputs
check_models = task_rules.check_models
check_optimizers = task_rules.check_optimizers
check_callbacks = callback_rules.check_callbacks


def check(config):
  """Checks every setting on its own.

  Args:
    config: the resolved ml_collections config (after command-line overrides).

  Raises:
    ConfigError: for the first bad setting (one line: what is wrong, what is valid).
  """
  _check_run(config)
  distribute_rules.check_settings(config)
  data_rules.check_settings(config.data)
  tags = model_rules.check_settings(config)
  _check_train(config.train)
  _check_init(config.init, config.train)
  _check_cadence(config)
  _check_outputs(config)
  tracking.check_settings(config.tracking)
  task_rules.check_task_settings(config)
  if tags is not None and config.task.name == task_rules.BUILT_IN:  # else known once built (build.py checks them)
    check_metric_references(config, tags)
  callback_rules.check_names(config.callbacks)


def check_metric_references(config, tags):
  """checkpoint.best_metric and early_stopping.metric must name one of the run's eval results (or be "")."""
  for key, name in (("checkpoint.best_metric", config.checkpoint.best_metric),
                    ("early_stopping.metric", config.early_stopping.metric)):
    if name and name not in tags:
      raise ConfigError(f"{key} '{name}' is not an eval metric of this run; valid: {', '.join(tags)} or '' (off)"
                        f" (eval.metrics adds more)")


def check_derived(config, plan, source):
  """What needs the replica count and the data: the batch split, the data against the plan (data/rules.py), the
  warmup's length.

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
  trains = config.mode == "train"  # an evaluation or a prediction reads no train batch
  data_rules.check_against_source(config.data, plan, source, trains)
  warmup = optimizers.warmup_steps(config.optimizer.warmup_epochs, plan.steps_per_epoch)
  if trains and warmup > 0 and warmup >= plan.total_steps:
    raise ConfigError(f"optimizer.warmup_epochs={config.optimizer.warmup_epochs} gives {warmup} warmup steps; it "
                      f"must be shorter than the run ({plan.total_steps} steps)")


def _check_run(config):
  """mode, the sidecar's waits, resume and preemption settings."""
  one_of("mode", config.mode, MODES_OF_RUN)
  if not isinstance(config.eval.checkpoint, str):
    raise ConfigError(f"eval.checkpoint must be '' (the sidecar), 'latest', 'best', a step or a checkpoint path, "
                      f"got {config.eval.checkpoint!r}")
  if config.eval.checkpoint and config.mode != "evaluate":
    raise ConfigError(f"eval.checkpoint={config.eval.checkpoint!r} is read by mode=evaluate (a chosen checkpoint "
                      f"evaluated once); this run's mode is '{config.mode}': add --config.mode=evaluate")
  predict = config.predict
  if not (isinstance(predict.rows_per_file, int) and predict.rows_per_file >= 1):
    raise ConfigError(f"predict.rows_per_file must be a whole number >= 1, got {predict.rows_per_file!r}")
  if not isinstance(predict.checkpoint, (str, int)) or predict.checkpoint in ("", True, False):
    raise ConfigError(f"predict.checkpoint must be 'latest', 'best', a step or a checkpoint path, got "
                      f"{predict.checkpoint!r}")
  for key in ("eval.sidecar_poll_seconds", "eval.sidecar_timeout_seconds"):
    if not config.eval[key.split(".")[1]] > 0:
      raise ConfigError(f"{key} must be > 0, got {config.eval[key.split('.')[1]]}")
  if not isinstance(config.resume.accept_changes, bool):
    raise ConfigError(f"resume.accept_changes must be True or False, got {config.resume.accept_changes!r}")
  preemption.signal_numbers(config.preemption.signals)
  code = config.preemption.exit_code
  if not isinstance(code, int) or isinstance(code, bool) or not 2 <= code <= 255:
    raise ConfigError(f"preemption.exit_code must be an integer in 2..255 (1 is a user error), got {code!r}; "
                      "143 is what Kubernetes (TFJob restartPolicy ExitCode) and GCE restart")


def _check_train(t):
  if t.global_batch_size is None and t.per_replica_batch_size is None:
    raise ConfigError("set train.global_batch_size (or train.per_replica_batch_size)")
  for key in ("global_batch_size", "per_replica_batch_size"):
    if t[key] is not None:
      at_least(f"train.{key}", t[key], 1)
  if t.steps is not None and t.steps < 1:
    raise ConfigError(f"train.steps must be >= 1 (or None to use train.epochs), got {t.steps}")
  if t.steps is None and not (t.epochs or 0) > 0:
    raise ConfigError(f"set train.steps or train.epochs (> 0); got steps=None, epochs={t.epochs}")
  if not isinstance(t.steps_per_loop, int) or t.steps_per_loop < 1:
    raise ConfigError(f"train.steps_per_loop must be a positive integer, got {t.steps_per_loop!r}")
  at_least("train.grad_accum_steps", t.grad_accum_steps, 1, "a positive integer")


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
    at_least(key, value, 0, "0 (only at the end / off) or a number of steps:")
  at_least("checkpoint.keep", config.checkpoint.keep, 1)
  one_of("nan_policy.mode", config.nan_policy.mode, NAN_POLICIES)
  at_least("nan_policy.max_retries", config.nan_policy.max_retries, 0)
  profile = tuple(config.summary.profile_steps)
  if profile and (len(profile) != 2 or not 0 <= profile[0] < profile[1]):
    raise ConfigError(f"summary.profile_steps must be (first, last) with 0 <= first < last, or (), got {profile}")
  fraction = config.summary.straggler_fraction
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not fraction >= 0:
    raise ConfigError(f"summary.straggler_fraction must be 0 (off) or a fraction >= 0 (0.2 = 20 % slower than the "
                      f"median worker), got {fraction!r}")
  at_least("summary.straggler_calls", config.summary.straggler_calls, 1)
  stopping = config.early_stopping
  one_of("early_stopping.mode", stopping.mode, MODES)
  at_least("early_stopping.patience", stopping.patience, 1)
  if not stopping.min_delta >= 0:
    raise ConfigError(f"early_stopping.min_delta must be >= 0, got {stopping.min_delta}")


def _check_outputs(config):
  one_of("checkpoint.best_mode", config.checkpoint.best_mode, MODES)
  if config.export_tflite and not config.export:
    raise ConfigError("export_tflite=True writes export/model.tflite beside the export, which export=False turns "
                      "off; set export=True or export_tflite=False")
  one_of("summary.progress_bar", config.summary.progress_bar, PROGRESS_BAR)
  for key, name in (("checkpoint.best_metric", config.checkpoint.best_metric),
                    ("early_stopping.metric", config.early_stopping.metric)):
    if name and not name.startswith("eval/"):
      raise ConfigError(f"{key} must be '' (off) or an eval result 'eval/<metric name>', got '{name}'")


def check_compiled_batchnorm(config, replicas, name, model):
  """XLA (jit_compile) compiles each replica's step on its own: a synchronized BatchNorm's cross-replica mean
  inside it cannot be compiled (it stopped at the first step with a merge_call traceback): one line instead."""
  synchronized = model_lib.synchronized_layers(model)
  if config.jit_compile and replicas > 1 and synchronized:
    raise ConfigError(f"jit_compile=True with model.sync_batchnorm on {replicas} replicas: XLA compiles each "
                      f"replica's step on its own, and the cross-replica mean of the synchronized BatchNorm of model "
                      f"'{name}' ({synchronized[0].name}, ...) cannot be compiled inside it (TensorFlow: merge_call "
                      f"in a nested tf.function); turn one off")
