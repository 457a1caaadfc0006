"""A model as Keras `fit` users already have it: its `compile()`d loss and metrics taken over by the built-in
classification (loss.name=""), the `train_step`/`test_step`/`compute_loss` overrides the framework does not call
named at build, and `model.train_step(...)` refused in one line when a task calls it inside the framework's step.

The compiled loss is applied per example (reduction none) and averaged over the GLOBAL batch like every loss
(N replicas compute what one does); its metrics become eval metrics (eval/<name>). Only what one output's loss
and metrics say is taken: a loss per output is refused (write a Task); the compiled optimizer is not used
(optimizer.* is), which one line says.
"""

import contextlib
import inspect

from absl import logging
import keras
import tensorflow as tf

from errors import ConfigError, described
from loops.modeling import losses
from loops import private_apis

PORT = "port it to a Task (docs/migrating.md 'Coming from Keras fit')"
FIT_METHODS = ("train_step", "test_step", "compute_loss")
_FIT_STEPS = ("train_step", "test_step")


def compiled_loss(model):
  """The loss identifier `model` was compile()d with, or None (not compiled, or compiled without a loss)."""
  return getattr(model, "loss", None) if getattr(model, "compiled", False) else None


def compiled_metrics(model):
  """[metric identifiers] of compile(metrics=..., weighted_metrics=...), in order; [] when there are none."""
  if not getattr(model, "compiled", False):
    return []
  arguments = private_apis.compile_arguments(model)
  found = []
  for given in (arguments.get("metrics"), arguments.get("weighted_metrics")):
    if isinstance(given, dict):
      raise ConfigError(f"model '{model.name}' was compiled with metrics per output ({sorted(given)}); the built-in "
                        f"classification reads one output: {PORT}")
    found += list(given or [])
  return found


def describe(identifier):
  """A loss or metric identifier as a person reads it: SparseCategoricalCrossentropy(from_logits=True)."""
  if isinstance(identifier, str):
    return identifier
  if isinstance(identifier, (keras.losses.Loss, keras.metrics.Metric)):
    config = identifier.get_config()
    shown = ", ".join(f"{k}={config[k]!r}" for k in ("from_logits", "k") if k in config)
    return f"{type(identifier).__name__}({shown})"
  return getattr(identifier, "__name__", type(identifier).__name__)


def loss_for_run(loss, data_settings, model, labels, outputs):
  """The built-in classification's loss from compile(): the per-example compiled loss when loss.name is "" and
  the model has one, else None (loss.name's loss trains; one line when it overrides a compiled loss). loss,
  data_settings: the loss and data settings (the data's mixup_alpha, cutmix_alpha)."""
  identifier = compiled_loss(model)
  if identifier is None:
    return None
  if loss.name:
    logging.warning("model '%s' was compiled with loss %s; the run trains loss.name=%r (the config's; loss.name='' "
                    "trains the compiled one)", model.name, describe(identifier), loss.name)
    return None
  if loss.label_smoothing or dict(loss.kwargs):
    raise ConfigError(f"loss.label_smoothing/loss.kwargs configure loss.name's loss; model '{model.name}' trains "
                      f"its compiled {describe(identifier)}: set them in compile(), or name a loss.name")
  if data_settings.mixup_alpha or data_settings.cutmix_alpha:
    raise ConfigError(f"data.mixup_alpha/cutmix_alpha give soft labels [batch, classes]; the compiled "
                      f"{describe(identifier)} of model '{model.name}' takes the data's labels: set "
                      f"loss.name='sparse_categorical_crossentropy' (it takes both) or turn mixing off")
  return per_example_loss(model, labels, outputs)


def check_one_loss(model):
  """ConfigError for a model compiled with a loss per output (said before its outputs are looked at)."""
  if isinstance(compiled_loss(model), (dict, list, tuple)):
    raise ConfigError(f"model '{model.name}' was compiled with a loss per output; the built-in classification "
                      f"trains one output: {PORT}")


def added_metrics(made, model, labels, outputs):
  """[(identifier, metric)] of the compiled metrics not already in `made` (eval.metrics' [(entry, metric)]): a
  name both give is eval.metrics' when it is the same metric (class and settings), else refused. Call inside the
  metrics' scope."""
  taken = {metric.name: metric for _, metric in made}
  added = []
  for identifier, metric in metrics(model, labels, outputs):
    same = taken.get(metric.name)
    if same is None:
      added.append((identifier, metric))
    elif type(same) is not type(metric) or _settings(same) != _settings(metric):
      raise ConfigError(f"model '{model.name}' was compiled with metric '{metric.name}' ({_described(metric)}); "
                        f"eval.metrics has another '{metric.name}' ({_described(same)}): rename one")
  return added


def _settings(metric):
  return {k: v for k, v in metric.get_config().items() if k not in ("name", "dtype")}


def _described(metric):
  settings = ", ".join(f"{k}={v!r}" for k, v in _settings(metric).items())
  return f"{type(metric).__name__}({settings})"


def per_example_loss(model, labels, outputs):
  """fn(labels, logits, *, images, outputs, step) -> [batch] losses: the compiled loss of `model` with reduction
  none (a copy: the user's object is left as it is), times a scalar loss_weights. labels, outputs: a zero example
  batch, to resolve "crossentropy" as Keras does and to probe the loss once (one line when it cannot run)."""
  identifier = compiled_loss(model)
  check_one_loss(model)
  weight = _loss_weight(model)
  loss = _shallow_copy(private_apis.resolve_loss(identifier, labels, outputs))  # "crossentropy" as Keras reads it
  loss.reduction = None
  name = f"compiled {describe(identifier)}"

  def fn(labels, logits, *, images=None, outputs=None, step=None):
    del images, outputs, step
    values = loss(labels, logits)
    losses.check_per_example(name, values, logits)
    return tf.cast(values, tf.float32) * weight

  fn.declared = frozenset()
  try:
    fn(labels, outputs)
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f"model '{model.name}': its {name} fails on labels {labels.shape.as_list()} {labels.dtype.name} "
                      f"and outputs {outputs.shape.as_list()}: {described(e)}") from e
  return fn


def _shallow_copy(loss):
  """A copy of the loss object sharing its attributes (copy.copy goes through Keras serialization, which resets a
  custom Loss's constructor arguments that get_config leaves out, and fails on a class not registered)."""
  copied = object.__new__(type(loss))
  copied.__dict__.update(loss.__dict__)
  return copied


def _loss_weight(model):
  weights = model.get_compile_config().get("loss_weights")
  if weights is None:
    return 1.0
  if isinstance(weights, (int, float)):
    return float(weights)
  raise ConfigError(f"model '{model.name}' was compiled with loss_weights={weights!r}; one output's loss takes one "
                    f"number: {PORT}")


def metrics(model, labels, outputs):
  """[(identifier, new keras Metric)] of the compiled metrics, resolved as Keras resolves them for these labels
  and outputs ("accuracy" -> SparseCategoricalAccuracy for class ids); a Metric object is copied fresh (its
  variables belong to no strategy). Call inside the metrics' scope."""
  made = []
  for identifier in compiled_metrics(model):
    if isinstance(identifier, keras.metrics.Metric):
      made.append((identifier, _fresh(model, identifier)))
    else:
      made.append((identifier, private_apis.resolve_metric(identifier, labels, outputs)))
  return made


def _fresh(model, metric):
  """A new metric of the same class and settings (from its get_config); ConfigError when a constructor argument
  the metric keeps comes back otherwise (get_config leaves it out: the copy would reset it silently)."""
  config = metric.get_config()
  fresh = type(metric).from_config(config)
  kept = [name for name in inspect.signature(type(metric).__init__).parameters
          if name not in ("self", "name", "dtype", "args", "kwargs") and name not in config and hasattr(metric, name)
          and getattr(fresh, name, None) != getattr(metric, name)]
  if kept:
    raise ConfigError(f"model '{model.name}' was compiled with metric {type(metric).__name__}, whose get_config() "
                      f"leaves out its constructor argument {kept[0]!r}: the run makes its own copy of every compiled "
                      f"metric from get_config(), which would reset it; return {kept[0]!r} from get_config()")
  return fresh


def warn_unused_overrides(name, model):
  """One warning line when the model's class overrides Keras' fit methods: the framework never calls them."""
  overridden = [m for m in FIT_METHODS if getattr(type(model), m, None) is not getattr(keras.Model, m)]
  if overridden:
    logging.warning("model '%s': %s overrides %s, which the framework does not call (it trains the task's loss or "
                    "step); %s", name, _where(type(model), overridden[0]), "/".join(overridden), PORT)
  return overridden


def warn_unused_compile(name, model, run_optimizer, step_keys, loss_taken, trained_by=None):
  """One warning line for every setting compile() gave that this run does not use, with what the run uses: the
  optimizer (another class, or its settings that differ from the run's optimizer `trained_by`), run_eagerly,
  jit_compile and steps_per_execution (the config's keys govern them), the loss and metrics of a task model (a Task
  trains its own loss); loss_taken: the built-in classification takes the compiled loss and metrics of the model
  named "model". run_optimizer: the optimizer settings; step_keys: (jit_compile, train.steps_per_loop)."""
  if not getattr(model, "compiled", False):
    return None
  unused = []
  optimizer = getattr(model, "optimizer", None)
  if optimizer is not None and type(optimizer).__name__.lower() != run_optimizer.name:
    unused.append(f"optimizer {type(optimizer).__name__} (optimizer.name={run_optimizer.name!r}, learning_rate "
                  f"{run_optimizer.learning_rate:g} trains it)")
  elif optimizer is not None and trained_by is not None:
    unused += optimizer_settings(optimizer, getattr(trained_by, "inner_optimizer", trained_by))
  unused += _step_settings(model, private_apis.compile_arguments(model), *step_keys)
  if not loss_taken and (compiled_loss(model) is not None or compiled_metrics(model)):
    unused.append("loss and metrics (the task's per_example_loss/train_step and eval_step are used)")
  if unused:
    logging.warning("model '%s' was compile()d; not used: %s", name, "; ".join(unused))
  return unused


def optimizer_settings(compiled, trained_by):
  """["the compiled optimizer's <key> <value> (the run's: <value>)"] for each of its settings the run's optimizer
  of the same class does not share (the learning rate as a number the run's schedule starts from)."""
  theirs, ours = compiled.get_config(), trained_by.get_config()
  differing = []
  for key, value in theirs.items():
    run_value = ours.get(key)
    if key == "name" or run_value == value:
      continue
    if isinstance(value, float) and isinstance(run_value, float) and abs(value - run_value) <= 1e-6 * abs(value):
      continue
    differing.append(f"{key} {_shown(value)} (the run's: {_shown(run_value)})")
  return [f"the compiled {type(compiled).__name__}'s " + ", ".join(differing) +
          " (optimizer.* set what trains: set them there to train these)"] if differing else []


def _shown(value):
  if isinstance(value, dict) and "class_name" in value:  # a learning-rate schedule
    return f"a {value['class_name']} schedule"
  return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _step_settings(model, arguments, jit_compile, steps_per_loop):
  """compile()'s run_eagerly (or the model's), jit_compile and steps_per_execution when given, with the config key
  that rules."""
  unused = []
  if arguments.get("run_eagerly") or getattr(model, "run_eagerly", False) is True:
    unused.append("run_eagerly=True (the step always runs as a tf.function: a Python error in it names its line "
                  "with --debug)")
  if arguments.get("jit_compile") not in (None, "auto", bool(jit_compile)):
    unused.append(f"jit_compile={arguments['jit_compile']} (--config.jit_compile={bool(arguments['jit_compile'])} "
                  "sets it)")
  if arguments.get("steps_per_execution", 1) not in (1, steps_per_loop):
    unused.append(f"steps_per_execution={arguments['steps_per_execution']} (train.steps_per_loop="
                  f"{steps_per_loop} is what a call runs)")
  return unused


def _where(cls, method):
  try:
    function = getattr(cls, method)
    return f"{cls.__name__} ({inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]})"
  except (OSError, TypeError):
    return cls.__name__


@contextlib.contextmanager
def fit_steps_refused(models, where):
  """While the framework traces a step: each model's train_step/test_step raises one line (Keras' fit step
  applies its own optimizer and metrics in a replica: train/loss 0 on one replica, a placeholder error on two).
  where: the task's method that runs, for the message."""
  patched = []
  for name, model in models.items():
    for method in _FIT_STEPS:
      if method not in vars(model):
        object.__setattr__(model, method, _refusal(name, model, method, where))
        patched.append((model, method))
  try:
    yield
  finally:
    for model, method in patched:
      object.__delattr__(model, method)


def _refusal(name, model, method, where):
  def refuse(*args, **kwargs):
    raise ConfigError(f"{where} calls models['{name}'].{method}: Keras fit's step ({type(model).__name__}) cannot "
                      f"run inside the framework's step (its optimizer, metrics and loss are not the run's); {PORT}")
  return refuse

