"""build(config, task) -> Parts: everything a run is made of, built once, in the right scopes.

Strategy, data source, plan (derived values), model, optimizer, step counter, loss, eval metrics, the run's
own checkpointed variables and the checkpoint holding them; loops/check.py judges each as it appears. Nothing is
written here.
"""

import dataclasses

from absl import logging
import keras
import tensorflow as tf

import data
from data import mixing
from loops import check
from loops import plan as plan_lib
from loops.distribute import cluster
from loops.distribute import execution
from loops.distribute import startup
from loops.distribute import strategy as strategy_lib
from loops.model import freeze as freeze_lib
from loops.model import losses
from loops.model import metrics as metrics_lib
from loops.model import model as model_lib
from loops.model import optimizers


@dataclasses.dataclass(frozen=True)
class Parts:
  task: cluster.Task
  strategy: tf.distribute.Strategy
  source: data.Source
  plan: plan_lib.Plan
  input_shape: tuple
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  step_counter: tf.Variable
  loss_fn: object  # fn(labels, logits, images=, outputs=, step=) -> per-example losses
  eval_metrics: dict  # {name: keras metric}, "loss" first
  run_variables: "RunVariables"
  checkpoint: tf.train.Checkpoint


class RunVariables(tf.Module):
  """Outer-loop values that must survive preemption and resume: saved in every checkpoint with the model."""

  def __init__(self):
    super().__init__(name="run")
    self.stopped_total_steps = tf.Variable(0, dtype=tf.int64, trainable=False)  # 0 = did not stop early
    self.early_stopping_best = tf.Variable(float("nan"), dtype=tf.float64, trainable=False)
    self.early_stopping_best_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
    self.early_stopping_evals_since = tf.Variable(0, dtype=tf.int64, trainable=False)


def build(config, task, kept=None):
  """Builds every part of the run for this task (config already passed loops/check.py's check and check_task).

  Args:
    config: the resolved config.
    task: this process's cluster.Task.
    kept: plan values a resumed run keeps from its record (loops/resume.py), or None.

  Returns:
    Parts (frozen).

  Raises:
    ConfigError: for what only the data, the replica count or the built model reveal.
  """
  with startup.bounded_start(task, config.cluster.startup_timeout_seconds):
    strategy = strategy_lib.build(config, task)
  keras.utils.set_random_seed(config.seed)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  source = data.load(config.data)
  plan = plan_lib.derive(config, strategy.num_replicas_in_sync, source.train_size,
                         num_input_pipelines=execution.input_pipelines(strategy, task),
                         epoch_steps=lambda global_batch: data.steps_per_epoch(source, config.data, global_batch),
                         kept=kept)
  check.check_derived(config, plan, source)
  input_shape = data.output_shape(source, config.data)
  loss_fn = losses.build(config.loss)
  logging.info("config:\n%s", config)
  logging.info("plan: %s; data '%s': %d train / %d eval examples, input %s, %d classes",
               plan, source.name, source.train_size, source.eval_size, input_shape, source.num_classes)
  model, optimizer, step_counter = _build_trainables(config, strategy, plan, input_shape, source.num_classes)
  check.check_model_outputs(loss_fn, model, input_shape, source.num_classes, soft_labels=mixing.mixes(config.data))
  with execution.metrics_scope(strategy):
    made = metrics_lib.build(tuple(config.eval.metrics), source.num_classes)
  check.check_metrics(made, tuple(config.eval.metrics))
  eval_metrics = metrics_lib.by_name(made)
  check.check_metric_references(config, metrics_lib.tags(eval_metrics))
  run_variables = RunVariables()  # plain host values, the same on every task
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_counter, run=run_variables)
  logging.info("model %s: %d parameters", config.model.name, model.count_params())
  return Parts(task=task, strategy=strategy, source=source, plan=plan, input_shape=input_shape, model=model,
               optimizer=optimizer, step_counter=step_counter, loss_fn=loss_fn, eval_metrics=eval_metrics,
               run_variables=run_variables, checkpoint=checkpoint)


def _build_trainables(config, strategy, plan, input_shape, num_classes):
  """Model, optimizer (built before the first step: a Keras 3 multi-replica pitfall) and step counter."""
  with strategy.scope():
    model = model_lib.build_model(config, input_shape, num_classes)
    if config.train.freeze:
      frozen = freeze_lib.freeze(model, tuple(config.train.freeze), config.train.freeze_batchnorm_stats)
      logging.info("train.freeze: %d layer(s) frozen, %d of %d parameters trained: %s", len(frozen),
                   sum(int(v.numpy().size) for v in model.trainable_variables), model.count_params(),
                   freeze_lib.compact(frozen))
    schedule = optimizers.learning_rate_schedule(config.optimizer, plan.learning_rate, plan.total_steps,
                                                 plan.steps_per_epoch)
    optimizer = optimizers.build(config.optimizer, schedule, loss_scaling=config.mixed_precision == "float16")
    optimizer.build(model.trainable_variables)
    step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  return model, optimizer, step_counter
