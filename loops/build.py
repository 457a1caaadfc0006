"""build_from(settings, config, role) -> Parts: everything a run is made of, built once, in the right scopes.

Strategy, data source and its settings, plan (derived values), models, optimizers, step counter, loss, eval metrics and
the checkpoint holding them (loops/persist/checkpoints.holding; callbacks add their own state to it);
loops/rules.py judges each as it appears. Each part is made from the settings sections it uses (configs/settings.py,
read once by the caller); the config bag goes only to the rules and to the task (Task.config). build(config, role)
reads the settings of a bag first (the checks, the finders, tests). Nothing is written here.
"""

import contextlib
import dataclasses
from typing import Any, Callable

from absl import logging
import keras
import numpy as np
import tensorflow as tf

import data
from configs import settings as settings_lib
from errors import ConfigError
from data import mixing
from loops import rules
from loops import plan as plan_lib
from loops import private_apis
from loops.core import console
from loops.distribute import cluster
from loops.distribute import execution
from loops.distribute import startup
from loops.distribute import strategy as strategy_lib
from loops.modeling import freeze as freeze_lib
from loops.modeling import keras_fit
from loops.modeling import losses
from loops.modeling import metrics as metrics_lib
from loops.modeling import model as model_lib
from loops.modeling import optimizers
from loops.modeling import random_layers
from loops.modeling import remat as remat_lib
from loops.persist import checkpoints
from loops import task as task_lib
from loops.task import classification as classification_lib


@dataclasses.dataclass(frozen=True)
class Parts:
  role: cluster.ClusterRole
  strategy: tf.distribute.Strategy
  source: data.Source
  data_settings: Any  # the data settings (configs/settings.py's data section) the pipelines read, handed on once here
  plan: plan_lib.Plan
  input_shape: tuple
  step_counter: tf.Variable
  task: task_lib.Task  # what is trained (loops/task)
  models: dict  # {name: keras.Model}
  optimizers: dict  # {model name: optimizer}, trainable models only
  learning_rates: dict  # {model name: scaled base learning rate}
  eval_means: dict  # {name: keras.metrics.Mean} of the task's per-example eval values, "loss" first
  eval_metrics: dict  # {name: keras metric}: eval_means, then the task's own metrics
  element_spec: tuple  # (features, targets) spec of one train example after preprocessing
  twin: Callable[[], Any]  # fn() -> a new model like the main one (the warm start loads .h5 weights into it)
  checkpoint: tf.train.Checkpoint

  @property
  def eval_tags(self):
    """Every eval result a run reports: eval/<metric>, then the task's reduce_eval names."""
    return metrics_lib.tags(list(self.eval_metrics) + list(self.task.eval_reduced))

  @property
  def main_model(self):
    """The model named "model" (else the first): the one exported, warm-started, averaged and histogrammed."""
    return _main(self.models)

  @property
  def main_optimizer(self):
    """The main model's optimizer (else the first; None when nothing is trained): the one the LR finder ramps."""
    return _main(self.optimizers)

  @property
  def task_metrics(self):
    return {name: m for name, m in self.eval_metrics.items() if name not in self.eval_means}


def _main(by_name):
  """The entry named "model", else the first, else None."""
  return by_name.get("model") or next(iter(by_name.values()), None)


@contextlib.contextmanager
def determinism_restored():
  """Leaves op determinism and Grappler's constant folding as they were on entry (build sets both for
  config.deterministic: deterministic_execution; they are process-wide: notebooks and tests run several configs in
  one process)."""
  enabled = private_apis.op_determinism_enabled()
  folding = tf.config.optimizer.get_experimental_options().get("constant_folding", True)
  try:
    yield
  finally:
    if not enabled:
      private_apis.disable_op_determinism()
    tf.config.optimizer.set_experimental_options({"constant_folding": folding})


def deterministic_execution():
  """Op determinism on, and Grappler's constant folding off: it rewrites a step differently from process to process
  (the determinism RFC: "Grappler graph optimizations may add nondeterministic behavior"). Measured: ResNet-20 with
  synchronized BatchNorm on device-resident data, one device, 3 steps under load: 4 of 9 processes ended with other
  weights (1e-7 of them) with it, 9 of 9 alike without it; 20 steps took 2.84-3.11 s with it, 2.91-3.00 s without."""
  tf.config.experimental.enable_op_determinism()
  tf.config.optimizer.set_experimental_options({"constant_folding": False})


def cluster_role(cluster_settings, workdir):
  """This process's cluster.ClusterRole from its environment, where the cluster settings say to look; `workdir`
  holds the address exchange of ranks started by an MPI launcher."""
  return cluster.from_environment(source=cluster_settings.source, slurm_port_base=cluster_settings.slurm_port_base,
                                  workdir=workdir, startup_timeout_seconds=cluster_settings.startup_timeout_seconds,
                                  k8s_port=cluster_settings.k8s_port)


def start_strategy(run, cluster_settings, role):
  """run.strategy for this process; a multi-worker one once every peer answers, bounded by
  cluster.startup_timeout_seconds (loops/distribute/startup.py). run, cluster_settings: the run and cluster
  settings."""
  with startup.bounded_start(role, cluster_settings.startup_timeout_seconds):
    return strategy_lib.build(run, cluster_settings, role)


def logged_config(config):
  """The config in the log (logs keep it; a person's screen, a terminal, has config.json instead)."""
  (logging.debug if console.is_terminal() else logging.info)("config:\n%s", config)


def build(config, role, kept=None, strategy=None):
  """build_from for a config bag (the checks, the finders, tests): its settings read once here."""
  return build_from(settings_lib.read(config), config, role, kept=kept, strategy=strategy)


def build_from(settings, config, role, kept=None, strategy=None, log_config=True):
  """Builds every part of the run for this process (config already passed loops/rules.py's check and check_role).

  Args:
    settings: the run's settings (configs/settings.py), read once by the caller; each part gets its sections.
    config: the resolved config bag, for the rules and the task (Task.config, BuildContext.config) only.
    role: this process's cluster.ClusterRole.
    kept: plan values a resumed run keeps from its record (loops/resume.py), or None.
    strategy: a strategy this process already started for an earlier config of the same strategy settings
      (loops/worker_check.py's workers train several configs), or None to start one (start_strategy).
    log_config: log the config (the checks' sides, a handful of builds of one config, log it once: logged_config).

  Returns Parts (frozen); raises ConfigError for what only the data, the replica count or the built model reveal.
  """
  run, model_settings, task_name = settings.run, settings.model, settings.task.name
  strategy = strategy or start_strategy(run, settings.cluster, role)
  _seed(run.seed, run.deterministic)
  data_settings = settings.data  # what the pipelines read, handed on once (parts.data_settings)
  source = data.load(settings.data, *task_lib.streams_of(task_name))
  plan = plan_lib.derive(settings.train, settings.optimizer, strategy.num_replicas_in_sync, source.train_size,
                         num_input_pipelines=execution.input_pipelines(strategy, role),
                         epoch_steps=lambda global_batch: data.steps_per_epoch(source, data_settings, global_batch),
                         kept=kept)
  rules.check_derived(config, plan, source)
  input_shape = data.output_shape(source, data_settings.image_size)
  classification = task_name == task_lib.BUILT_IN
  loss_fn = losses.build(settings.loss) if classification else None
  if log_config:
    logged_config(config)
  classes = f", {source.num_classes} classes" if source.num_classes else ""  # a regression's data has none
  logging.info("plan: %s; data '%s': %d train / %d eval examples, input %s%s",
               plan, source.name, source.train_size, source.eval_size, input_shape, classes)
  if classification:  # its metrics and model need the classes: said before either is made
    _known(source.num_classes, model_settings.name, data_settings.name)
  metric_names = tuple(settings.eval.metrics)
  made = _classification_metrics(strategy, metric_names, source.num_classes) if classification else []
  task = task_lib.load(config, settings.task, loss_fn, {
      name: m for name, m in metrics_lib.by_name(made).items() if name != metrics_lib.LOSS})
  element_spec = _element_spec(source, input_shape)
  learning_rates = {}
  models, optimizers_by_model, step_counter = _build_trainables(settings, config, strategy, plan, task, element_spec,
                                                                source.num_classes, learning_rates)
  model = _main(models)
  if classification:
    made = _take_compiled(settings.loss, metric_names, data_settings, strategy, task, model, element_spec, made)
    rules.check_model_outputs(task.loss_fn, model, input_shape, source.num_classes,
                              soft_labels=mixing.mixes(data_settings))
  eval_spec = source.eval.element_spec if source.streams else element_spec  # a task's eval stream's
  eval_means, eval_metrics = _eval_metrics(strategy, task, models, eval_spec, plan, made)
  checkpoint = checkpoints.holding(models, optimizers_by_model, step_counter)
  logging.info("task %s: %s", task_name, ", ".join(
      f"{name} {m.count_params()} parameters" for name, m in models.items()))
  parts = Parts(role=role, strategy=strategy, source=source, data_settings=data_settings, plan=plan,
                input_shape=input_shape, step_counter=step_counter, task=task, models=models,
                optimizers=optimizers_by_model, learning_rates=learning_rates, eval_means=eval_means,
                eval_metrics=eval_metrics, element_spec=element_spec, checkpoint=checkpoint,
                twin=lambda: model_lib.build_model(model_settings, run.mixed_precision, input_shape,
                                                   source.num_classes))
  rules.check_metric_references(config, parts.eval_tags)
  return parts


def _seed(seed, deterministic):
  """Keras' seeds from `seed`; deterministic_execution when `deterministic` (undone by determinism_restored)."""
  keras.utils.set_random_seed(seed)
  if deterministic:
    deterministic_execution()


def _classification_metrics(strategy, metric_names, num_classes):
  """The built-in classification's eval metrics eval.metrics names (`metric_names`), made in the metrics' scope and
  checked."""
  with execution.metrics_scope(strategy):
    made = metrics_lib.build(metric_names, num_classes)
  rules.check_metrics(made, metric_names)
  return made


def _take_compiled(loss, metric_names, data_settings, strategy, task, model, element_spec, made):
  """The built-in classification on a compile()d model (loops/modeling/keras_fit.py): its loss when loss.name is
  "", its metrics after eval.metrics' (`metric_names`). loss, data_settings: their settings. Returns every
  eval metric made."""
  keras_fit.check_one_loss(model)  # before its outputs are asked for 'logits'
  labels = tf.zeros([2, *element_spec[1].shape], element_spec[1].dtype)
  outputs, _ = classification_lib.forward(model, tf.zeros([2, *element_spec[0].shape], element_spec[0].dtype), False)
  loss_fn = keras_fit.loss_for_run(loss, data_settings, model, labels, outputs)
  if loss_fn is not None:
    task.loss_fn = loss_fn
  with execution.metrics_scope(strategy):
    added = keras_fit.added_metrics(made, model, labels, outputs)
  rules.check_metrics(made + added, metric_names + tuple(keras_fit.describe(i) for i, _ in added))
  task.add_metrics(metrics_lib.by_name(added))
  if loss_fn is not None or added:
    logging.info("model '%s' was compile()d: the run trains %s, reports %s", model.name,
                 "its loss per example over the global batch" if loss_fn else f"loss.name={loss.name!r}",
                 ", ".join(metrics_lib.tags([m.name for _, m in made + added])))
  return made + added


def _element_spec(source, input_shape):
  """(features, targets) spec of one train example as the step sees it: image sources give float32 images of
  input_shape (after resizing) and their labels; other sources their own nest."""
  features, targets = source.train.element_spec[:2]
  if source.image_shape is None:
    return features, targets
  return tf.TensorSpec(input_shape, tf.float32), tf.TensorSpec(targets.shape, targets.dtype)


def _eval_metrics(strategy, task, models, element_spec, plan, made):
  """(means of the task's per-example eval values, every eval metric by name), created in the metrics' scope."""
  with execution.metrics_scope(strategy):
    if made:  # the built-in: "loss" and eval.metrics, as check_metrics accepted them
      eval_metrics = metrics_lib.by_name(made)
      return {metrics_lib.LOSS: eval_metrics[metrics_lib.LOSS]}, eval_metrics
    task_metrics = task.build_metrics()
    names = task_lib.eval_names(task, models, element_spec, plan.global_batch_size, task_metrics)
    means = {name: keras.metrics.Mean(name=name) for name in names}
  clash = sorted(set(means) & set(task_metrics))
  if clash:
    raise ConfigError(f"{type(task).__name__}: eval_step values and build_metrics share the names {clash}")
  return means, {**means, **task_metrics}


def trained_parameters(parts):
  """Parameters the run trains (every optimizer's variables' sizes)."""
  return sum(int(np.prod(v.shape)) for name in parts.optimizers for v in parts.models[name].trainable_variables)


def _known(num_classes, model_name, data_name):
  """num_classes for a model model.name names; ConfigError when data.name's data does not say it (a task's data)."""
  if num_classes < 1:
    raise ConfigError(f"the model model.name='{model_name}' needs the number of classes, which "
                      f"data.name='{data_name}' does not say (its targets are not integer class ids "
                      "[examples], or it is an input function): set --config.data.num_classes=N")
  return num_classes


def _build_trainables(settings, config, strategy, plan, task, element_spec, num_classes, learning_rates):
  """The task's models (built on the element spec), their optimizers (built before the first step: a Keras 3
  multi-replica pitfall) and the step counter, in the strategy's scope (config: the bag, BuildContext.config)."""
  made_rates = {}  # id(optimizer) -> its scaled base learning rate
  run, model_settings, train = settings.run, settings.model, settings.train
  with strategy.scope():
    context = task_lib.BuildContext(
        config, element_spec, num_classes,
        make_model=lambda: model_lib.build_model(model_settings, run.mixed_precision, tuple(element_spec[0].shape),
                                                 _known(num_classes, model_settings.name, settings.data.name)),
        make_optimizer=lambda **overrides: _make_optimizer(settings.optimizer, run.mixed_precision, plan, made_rates,
                                                           overrides))
    # Keras marks the layers built inside (model.remat); every model a task builds takes the run's precision
    with remat_lib.scope(model_settings), model_lib.precision_policy(run.mixed_precision):
      models = dict(task.build_models(context))
    rules.check_models(task, models)
    for name, model in models.items():
      _ensure_built(model, element_spec)
      keras_fit.warn_unused_overrides(name, model)
      model_lib.configure_batchnorm(model, model_settings)  # every model of the task, not only the config's
      rules.check_compiled_batchnorm(config, plan.replicas, name, model)
      _key_random_layers(name, model, run.seed)
      _rematerialize(name, model, model_settings.remat)
    if train.freeze:
      _freeze(tuple(train.freeze), train.freeze_batchnorm_stats, list(models.values()))
    optimizers_by_model = dict(task.build_optimizers(context, models))
    for name, optimizer in optimizers_by_model.items():
      learning_rates[name] = made_rates.get(id(optimizer), plan.learning_rate)
    for name, model in models.items():
      keras_fit.warn_unused_compile(name, model, settings.optimizer, (run.jit_compile, train.steps_per_loop),
                                    loss_taken=settings.task.name == task_lib.BUILT_IN,
                                    trained_by=optimizers_by_model.get(name))
    rules.check_optimizers(task, models, optimizers_by_model, run.mixed_precision == "float16")
    for name, optimizer in optimizers_by_model.items():
      clipping = optimizers.take_over_the_sum(optimizer, name)
      if clipping:
        logging.info("optimizer '%s' clips by %s=%g after the cross-replica gradient sum", name, *clipping)
      if task.transforms_gradients and not getattr(
          getattr(optimizer, "inner_optimizer", optimizer), "sum_taken_over", False):
        raise ConfigError(f"{type(task).__name__}.transform_gradients needs keras.optimizers optimizers; "
                          f"'{name}' is {type(optimizer).__name__}")
      optimizer.build(models[name].trainable_variables)
    step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  return models, optimizers_by_model, step_counter


def _key_random_layers(name, model, seed):
  """The model's random layers draw per example, keyed on the step and the example's global row; the ones that
  cannot be keyed are named (N replicas then draw otherwise than one)."""
  keyed = random_layers.key(model, name, seed)
  if keyed:
    logging.info("model '%s': %d random layer(s) draw per example, keyed on the step and the example's row of the "
                 "global batch (the same on any number of replicas)", name, len(keyed))
  left = random_layers.unkeyed(model)
  if left:
    logging.warning("model '%s': %s draw from Keras' seed state, the same values on every replica: N replicas train "
                    "otherwise than one (--check=replicas names them)", name, ", ".join(l.path for l in left))


def _rematerialize(name, model, remat):
  """model.remat (`remat`): the blocks of `model` recomputed as one each, or Keras' marked layers through the
  framework's recomputation (loops/modeling/remat.py); refused for a model with random layers that are not keyed."""
  if not remat:
    return
  remat_lib.refuse_unkeyed(model, name)
  if remat == "blocks":
    logging.info("model '%s': %d blocks recomputed in the backward pass", name, remat_lib.recompute_blocks(model))
  else:
    remat_lib.install(model)
    logging.info("model '%s': layers Keras' RematScope(%r) marked are recomputed in the backward pass", name,
                 remat)


def _make_optimizer(optimizer_settings, mixed_precision, plan, made_rates, overrides):
  """An optimizer from the optimizer settings with `overrides` (of optimizer.* settings, or more arguments of its
  Keras class); its scaled base learning rate is noted under its id."""
  keys = [field.name for field in dataclasses.fields(optimizer_settings)]
  chosen = {key: value for key, value in overrides.items() if key in keys}
  opt_config = settings_lib.replaced(optimizer_settings, "optimizer.", **chosen)
  keras_arguments = optimizers.keras_arguments_of(opt_config.name, {
      key: value for key, value in overrides.items() if key not in chosen}, keys)
  base = optimizer_settings.learning_rate
  peak = plan.learning_rate * (opt_config.learning_rate / base if base else 1.0)
  schedule = optimizers.learning_rate_schedule(opt_config, peak, plan.total_steps, plan.steps_per_epoch)
  optimizer = optimizers.build(opt_config, schedule, loss_scaling=mixed_precision == "float16",
                               keras_arguments=keras_arguments)
  made_rates[id(optimizer)] = peak
  return optimizer


def _ensure_built(model, element_spec):
  """A subclassed model creates its variables at its first call: call it once on a zero example, so optimizers
  are built over every variable (else Keras' `Unknown variable` at the first step)."""
  if model.built and model.weights:
    return
  model(task_lib.zero_batch(element_spec[0], 1), training=False)  # a sequence of unknown length: 1 long


def _freeze(patterns, batchnorm_stats, models):
  """train.freeze (`patterns`) and train.freeze_batchnorm_stats on `models`, said in one line."""
  frozen = freeze_lib.freeze(models, patterns, batchnorm_stats)
  logging.info("train.freeze: %d layer(s) frozen, %d of %d parameters trained: %s", len(frozen),
               sum(int(v.numpy().size) for m in models for v in m.trainable_variables),
               sum(m.count_params() for m in models), freeze_lib.compact(frozen))
