"""loops/rules.py: every setting is checked up front, with one line naming it and what is valid."""

import pytest

from errors import ConfigError
from loops import rules
from tests.conftest import load_config


@pytest.mark.parametrize("key, value, message", [
    ("train.steps", 0, "train.steps must be >= 1"),
    ("train.epochs", None, "set train.steps or train.epochs"),
    ("train.steps_per_loop", 0, "train.steps_per_loop must be a positive integer"),
    ("optimizer.lr_scaling", "linear_replica", "did you mean 'linear_replicas'"),
    ("eval.every_steps", -5, r"eval.every_steps must be 0 \(only at the end / off\) or a number of steps: >= 0"),
    ("checkpoint.every_steps", -1, "checkpoint.every_steps must be"),
    ("checkpoint.best_mode", "maximum", r"unknown checkpoint.best_mode 'maximum' .*valid: min, max"),
    ("checkpoint.best_metric", "eval/acuracy", r"checkpoint.best_metric 'eval/acuracy' is not an eval metric of this "
                                               r"run; valid: eval/loss, eval/accuracy, eval/top5_accuracy or ''"),
    ("checkpoint.best_metric", "accuracy", "checkpoint.best_metric must be '' .* 'eval/<metric name>', got 'accuracy'"),
    ("summary.progress_bar", "yes", r"unknown summary.progress_bar 'yes'; valid: auto, on, off"),
    ("summary.profile_steps", (5, 2), r"summary.profile_steps must be \(first, last\) with 0 <= first < last"),
    ("data.mean", (0.5,), "data.mean and data.std must be set together"),
    ("data.pipeline_threads", -1, "data.pipeline_threads must be None"),
    ("mixed_precision", "fp16", r"unknown mixed_precision 'fp16'.*valid: None, bfloat16, float16"),
    ("preemption.signals", "SIGTERM,SIGUSR3", r"preemption.signals: unknown or uncatchable signal 'SIGUSR3'; valid: "
                                              r"SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP, SIGCONT"),
    ("preemption.signals", "SIGKILL", r"uncatchable signal 'SIGKILL'"),
    ("preemption.exit_code", 1, r"preemption.exit_code must be an integer in 2..255 \(1 is a user error\), got 1"),
    ("preemption.exit_code", 300, r"preemption.exit_code must be an integer in 2..255"),
    ("cluster.bytes_per_pack", -1, r"cluster.bytes_per_pack must be a number of bytes \(0 = one pack\) >= 0, got -1"),
    ("nan_policy.mode", "retry", r"unknown nan_policy.mode 'retry'; valid: stop, rollback"),
    ("early_stopping.metric", "eval/los", r"early_stopping.metric 'eval/los' is not an eval metric"),
    ("early_stopping.mode", "down", r"unknown early_stopping.mode 'down'"),
    ("early_stopping.patience", 0, "early_stopping.patience must be an integer >= 1"),
    ("eval.metrics", ("accuracy", "top5_acuracy"), r"unknown eval metric 'top5_acuracy' \(did you mean "
                                                   r"'top5_accuracy'\?\)"),
    ("eval.metrics", ("nowhere.metrics:f1",), r"cannot import module 'nowhere.metrics' for eval.metrics="),
    ("callbacks", ("nowhere.hooks:make",), r"cannot import module 'nowhere.hooks' for callbacks='nowhere.hooks:make'"),
    ("callbacks", ("tests.fixtures.plugins.my_callbacks:no_such",), r"module 'tests.fixtures.plugins.my_callbacks' "
                                                                     r"has no 'no_such'"),
    ("callbacks", ("tests.fixtures.plugins.my_callbacks:takes_nothing",),
     r"callbacks='tests.fixtures.plugins.my_callbacks:takes_nothing' must be a function taking 1 positional argument"),
    ("strategy", "mirorred", r"unknown strategy 'mirorred' \(did you mean 'mirrored'\?\)"),
    ("model.name", "resnet5Ov2", r"unknown model 'resnet5Ov2' \(did you mean 'resnet50v2'\?\)"),
    ("data.name", "cifar_10", r"unknown dataset 'cifar_10' \(did you mean 'cifar10'\?\)"),
    ("loss.name", "nowhere.losses:focal", "cannot import module 'nowhere.losses' for loss.name="),
])
def test_a_bad_setting_is_one_clear_error(key, value, message):
  c = load_config("digits_cnn")
  group, _, name = key.rpartition(".")
  node = c
  for part in filter(None, group.split(".")):
    node = node[part]
  with c.unlocked():
    node[name] = value
  with pytest.raises(ConfigError, match=message):
    rules.check(c)


def test_every_shipped_config_passes_the_check():
  from tests.test_main import SHIPPED
  for name in SHIPPED:
    rules.check(load_config(name))
    rules.check(load_config(name, "synthetic"))


def test_rollback_is_refused_with_parameter_servers():
  c = load_config("digits_cnn")
  c.strategy, c.nan_policy.mode = "parameter_server", "rollback"
  with pytest.raises(ConfigError, match="nan_policy.mode='rollback' is not available with parameter_server"):
    rules.check(c)


def test_float16_under_central_storage_on_several_replicas_is_refused_before_anything_runs():
  """Keras 3's LossScaleOptimizer fails there at the first step (its loss scale is a variable no replica may
  assign: measured on 2 CPU replicas); on one replica it runs (measured too)."""
  from loops.distribute import cluster
  c = load_config("digits_cnn")
  c.strategy, c.mixed_precision, c.cpu_replicas = "central_storage", "float16", 2
  with pytest.raises(ConfigError, match="mixed_precision='float16' under central_storage on 2 replicas: Keras 3's "
                                        "LossScaleOptimizer cannot update its loss scale there"):
    rules.check_role(c, cluster.ClusterRole())
  c.cpu_replicas = 1
  rules.check_role(c, cluster.ClusterRole())
