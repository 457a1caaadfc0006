"""The Task contract: a researcher's models, optimizers, loss or whole step, and eval, as one class.

A task chooses one of two levels:
  loss level (most research): `per_example_loss(batch, models, ctx)` returns one loss per example of this
    replica's batch; the framework takes the gradient of all trained models, averages over the GLOBAL batch,
    applies each optimizer (gradient accumulation and float16 loss scaling included).
  step level: `train_step(batch, models, optimizers, ctx)` does everything (several models and optimizers,
    several gradient computations, nested tapes) and returns this replica's share of the global loss
    (`ctx.average(per_example)`), which is reported as train/loss.
Both run once per replica inside the compiled call; `ctx` (loops/task/context.py) supplies what keeps the step
correct on any number of replicas. `main.py --check=replicas` proves it for a given task.

A batch is what the data source yields: (features, targets) for training; eval steps get the same pair and
`ctx.weights` (0 for padding rows). Features and targets are any nest of tensors. A task that declares named
`streams` gets {stream: (features, targets)} in training and {eval_stream: (features, targets)} in eval.
"""

import keras


class Task:
  """Base class for a user's task (`task.name=package.module:Name`); override what you need.

  Attributes:
    train_metrics: names the step reports with ctx.log(name, value) as train/<name>.
    eval_collect: names of eval_step values gathered over the WHOLE eval set (rows of any shape [batch, ...]: every
      replica's and worker's, padding dropped) instead of averaged; reduce_eval turns them into results.
    eval_reduced: the names reduce_eval returns (eval/<name>; each may drive checkpoint.best_metric).
    update_every: {model name: k}: that model's optimizer applies only on the steps where step % k == k - 1 (k=5:
      steps 4, 9, ...; WGAN-GP's n_critic); models not listed update every step. A step-level task branches on
      ctx.updates(name), a Python bool (the step is traced once per combination of updating models, at most 3
      listed); at the loss level the framework skips the gradients of models that do not update.
    streams: {name: k}: the task reads several named input streams (data.name an input function taking
      `stream`), stream `name` k times the run's global batch per step (the first stream's k is 1: the run's global
      batch, epoch and train size are its). Each stream has its own epoch length and resumes exactly; the batch
      is {name: (features, targets)}; a loss-level per_example_loss may return {name: per-example losses}, each
      averaged over its stream's global batch (ctx.average(values, stream=name)). Read from the class.
    eval_stream: the stream whose eval split the eval reads (default: the first); eval batches are
      {eval_stream: (features, targets)}.
    config: the run's config (set by the framework before any method is called).
    kwargs: task.kwargs as a dict (also passed to the constructor; set before any method is called).
  """

  train_metrics = ()
  update_every = {}
  eval_collect = ()
  eval_reduced = ()
  streams = {}
  eval_stream = None
  config = None
  kwargs = {}

  def build_models(self, ctx):
    """{name: keras.Model}. The model named "model" is the one exported, warm-started and frozen by
    train.freeze. A model with `trainable = False` gets no optimizer and is not counted as trained."""
    return {"model": ctx.config_model()}

  def build_optimizers(self, ctx, models):
    """{model name: optimizer} for every trainable model: the configured optimizer, each its own copy.
    `ctx.optimizer(learning_rate=...)` makes one with another base learning rate (scaled like the config's)."""
    return {name: ctx.optimizer() for name, model in models.items() if model.trainable}

  def per_example_loss(self, batch, models, ctx):
    """Loss level: per-example losses, shape [replica batch]. Never reduce them yourself."""
    raise NotImplementedError(f"{type(self).__name__} defines neither per_example_loss nor train_step")

  def train_step(self, batch, models, optimizers, ctx):
    """Step level: the whole update; returns this replica's share of the global loss (ctx.average(...))."""
    raise NotImplementedError

  def transform_gradients(self, gradients, ctx):
    """Loss level, optional: {model name: [gradient of each trainable variable]} summed over every replica and
    worker (the same on each: whatever you compute from them is replica-correct), before the optimizers (their
    clipping included); return the same structure. Clip one model's, log norms (ctx.log), zero an update by
    ctx.step. Only a task that overrides it pays its one all-reduce of the gradients (the optimizers then sum
    nothing); under float16 it gets and returns unscaled gradients."""
    return gradients

  @property
  def transforms_gradients(self):
    """True when the task overrides transform_gradients."""
    return type(self).transform_gradients is not Task.transform_gradients

  def eval_step(self, batch, models, ctx):
    """{name: per-example values [replica batch]}, each reported as eval/<name> (the weighted mean over the eval
    set). Update the task's Keras metrics (build_metrics) here with ctx.metrics[name].update_state(...,
    sample_weight=ctx.weights). Default: the loss."""
    return {"loss": self.per_example_loss(batch, models, ctx)}

  def predict_step(self, batch, models, ctx):
    """{name: per-example outputs [replica batch, ...]}: what mode=predict writes for each example, and what the
    exported SavedModel (and export/model.tflite) serve under the same names. The batch's targets are None when
    the input has none (serving: (features, None), the features as Task.serving_spec declares them); ctx is in
    inference mode (ctx.training False; in serving its global_batch_size is the served batch's). Default: the
    model named "model" on the features in inference mode: its dict of outputs, or {"outputs": output}."""
    features = next(iter(batch.values()))[0] if isinstance(batch, dict) else batch[0]  # streams: the eval stream's
    outputs = models["model"](features, training=False)
    return dict(outputs) if isinstance(outputs, dict) else {"outputs": outputs}

  def reduce_eval(self, collected):
    """{name: float} for the names in eval_reduced, from {name: numpy array [eval examples, ...]} of the
    eval_collect values (e.g. kNN accuracy on embeddings, an AUC over the set). Runs on the host once per eval,
    on every worker alike."""
    return {}

  def build_metrics(self):
    """{name: keras.metrics.Metric} reported as eval/<name>, updated in eval_step (created in the right scope)."""
    return {}

  def serving_spec(self, features_spec):
    """What the exported model named "model" takes, per example (the serving SavedModel's input): by default the
    task's features. A generator would return its noise spec."""
    return features_spec

  @property
  def writes_step(self):
    """True when the task overrides train_step (step level)."""
    return type(self).train_step is not Task.train_step


class BuildContext:
  """What build_models / build_optimizers get: the config, the batch's spec and the configured factories."""

  def __init__(self, config, element_spec, num_classes, make_model, make_optimizer):
    self.config = config
    self.element_spec = element_spec  # (features spec, targets spec) of one example
    self.num_classes = num_classes
    self._make_model, self._make_optimizer = make_model, make_optimizer

  @property
  def features_spec(self):
    return self.element_spec[0]

  @property
  def targets_spec(self):
    return self.element_spec[1]

  def config_model(self):
    """The model the config names (model.name, model.kwargs) for these features and classes (data.num_classes
    for a task's data: set, or the largest integer target + 1 of array data)."""
    return self._make_model()

  def optimizer(self, **overrides):
    """A new optimizer from the config's optimizer settings; overrides replace optimizer.* keys (a
    learning_rate is scaled and scheduled like optimizer.learning_rate); any other keyword is an argument of the
    Keras optimizer class (beta_1, epsilon, clipnorm, ...), one it does not take is refused in one line."""
    return self._make_optimizer(**overrides)

  def load_model(self, path):
    """A model saved as `.keras` (e.g. a finished run's export/model.keras): for a frozen teacher."""
    return keras.models.load_model(path, compile=False)
