"""Optimizers by name and the learning-rate scaling rules, derived from the final batch and replica count."""

import contextlib
import inspect
import math
import threading

import keras
import tensorflow as tf

from errors import ConfigError
from loops import private_apis


LR_SCALING = {
    "none": lambda lr, global_batch, replicas: lr,
    "linear_replicas": lambda lr, global_batch, replicas: lr * replicas,  # the seeds' rule
    "linear_batch_256": lambda lr, global_batch, replicas: lr * global_batch / 256,
    "sqrt_replicas": lambda lr, global_batch, replicas: lr * math.sqrt(replicas),
}
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "piecewise", "cosine")


class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
  """lr = target x step / warmup_steps for step < warmup_steps, then after(step) (Keras has no generic warmup)."""

  def __init__(self, target, warmup_steps, after):
    self.target, self.warmup_steps, self.after = target, warmup_steps, after

  def __call__(self, step):
    step = keras.ops.cast(step, "float32")
    after = self.after(step) if callable(self.after) else keras.ops.convert_to_tensor(self.after, "float32")
    warm = self.target * step / self.warmup_steps
    return keras.ops.where(step < self.warmup_steps, warm, after)

  def get_config(self):
    return {"target": self.target, "warmup_steps": self.warmup_steps, "after": self.after}


def warmup_steps(warmup_epochs, steps_per_epoch):
  """Steps of linear warmup: optimizer.warmup_epochs (`warmup_epochs`) in whole steps."""
  return int(round(warmup_epochs * steps_per_epoch))


def learning_rate_schedule(opt_config, peak_lr, total_steps, steps_per_epoch):
  """A float (constant, no warmup) or a Keras schedule of the optimizer's update count (the settings are checked
  by loops/rules.py)."""
  name = opt_config.schedule
  warmup = warmup_steps(opt_config.warmup_epochs, steps_per_epoch)
  if name == "cosine":
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else peak_lr, decay_steps=max(total_steps - warmup, 1),
        alpha=opt_config.final_lr_fraction, warmup_target=peak_lr if warmup else None, warmup_steps=warmup)
  after = peak_lr
  if name == "piecewise":
    boundaries = [int(round(e * steps_per_epoch)) for e in opt_config.decay_epochs]
    values = [peak_lr * opt_config.decay_factor ** i for i in range(len(boundaries) + 1)]
    after = keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
  return LinearWarmup(peak_lr, warmup, after) if warmup else after


def scaled_learning_rate(opt_config, global_batch_size, replicas):
  """optimizer.learning_rate scaled by optimizer.lr_scaling for this global batch and replica count."""
  return float(LR_SCALING[opt_config.lr_scaling](opt_config.learning_rate, global_batch_size, replicas))


CLASSES = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW}


def build(opt_config, learning_rate, loss_scaling=False, keras_arguments=None):
  """A Keras optimizer; create it inside strategy.scope() and build() it there before the first step.

  learning_rate: a float or a schedule. loss_scaling wraps it in a LossScaleOptimizer (float16 training).
  keras_arguments: more arguments of the Keras class (checked by keras_arguments_of), e.g. beta_1.
  """
  optimizer = _build(opt_config, learning_rate, dict(keras_arguments or {}))
  return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaling else optimizer


def keras_arguments_of(name, arguments, settings):
  """The arguments of ctx.optimizer(...) that are not optimizer.* settings: each must be an argument of the Keras
  class of optimizer `name` that the settings do not set; else ConfigError naming the valid ones."""
  cls = CLASSES[name]
  taken = {"learning_rate", "global_clipnorm", "weight_decay", "use_ema", "ema_momentum", "momentum", "nesterov"}
  valid = sorted(set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"} - taken)
  unknown = sorted(set(arguments) - set(valid))
  if unknown:
    raise ConfigError(f"ctx.optimizer({', '.join(f'{k}=...' for k in unknown)}): neither an optimizer.* setting "
                      f"({', '.join(sorted(settings))}) nor an argument of keras.optimizers.{cls.__name__} "
                      f"({', '.join(valid)})")
  return dict(arguments)


def _build(opt_config, learning_rate, keras_arguments):
  name = opt_config.name
  common = dict(learning_rate=learning_rate, global_clipnorm=opt_config.global_clipnorm, **keras_arguments)
  if opt_config.ema_decay:  # Keras keeps the average in optimizer variables: checkpointed with the optimizer
    common.update(use_ema=True, ema_momentum=float(opt_config.ema_decay))
  if name == "sgd":
    return keras.optimizers.SGD(momentum=opt_config.momentum, nesterov=opt_config.nesterov,
                                weight_decay=opt_config.weight_decay, **common)
  if name == "adam":
    return keras.optimizers.Adam(weight_decay=opt_config.weight_decay, **common)
  assert name == "adamw", name  # loops/rules.py allows only OPTIMIZERS
  return keras.optimizers.AdamW(weight_decay=opt_config.weight_decay or 0.004, **common)


CLIP_SETTINGS = ("global_clipnorm", "clipnorm", "clipvalue")
CLIP_SCOPE = "clip_after_cross_replica_sum"  # the replica check tells its ops from a step's own clipping


# Steps tracing an apply of gradients they summed themselves, process-wide and not per thread: MirroredStrategy
# traces each replica in a thread of its own, and Keras' LossScaleOptimizer applies every replica's gradients from
# the thread of its merge_call.
_SUMMED = {"depth": 0}
_SUMMED_LOCK = threading.Lock()


@contextlib.contextmanager
def gradients_already_summed():
  """Inside, optimizers taken over by take_over_the_sum apply the gradients they get as they are: the step summed
  them over the replicas itself (Task.transform_gradients)."""
  with _SUMMED_LOCK:
    _SUMMED["depth"] += 1
  try:
    yield
  finally:
    with _SUMMED_LOCK:
      _SUMMED["depth"] -= 1


def sum_clip_apply(optimizer, grads, variables):
  """optimizer.apply_gradients as the framework took it over (take_over_the_sum): the cross-replica sum of the
  gradients (none inside gradients_already_summed()), then the clipping on the summed gradients, then the update."""
  optimizer.apply_gradients(zip(grads, variables))


def take_over_the_sum(optimizer, name="model"):
  """Takes over the optimizer's cross-replica gradient sum: its clipping (global_clipnorm, clipnorm or clipvalue)
  moves after the sum, and inside gradients_already_summed() it sums nothing.

  Keras 3 clips inside apply_gradients BEFORE summing the replicas' gradients, so each replica clips its own
  partial gradient and N replicas update otherwise than one. Here Keras is given no clip setting and its own
  all-reduce is followed by the clipping, on the summed gradients, alike on every replica: no further collective.
  Sparse gradients are made dense first (dense_gradients).
  Returns (setting, value) of the clipping, or None when the optimizer does not clip.
  """
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer: the one that applies
  settings = [(key, getattr(inner, key, None)) for key in CLIP_SETTINGS if getattr(inner, key, None)]
  summed = private_apis.gradient_sum(inner)
  if summed is None:
    if settings:
      raise ConfigError(f"optimizer '{name}' ({type(inner).__name__}) clips with {settings[0][0]}, which this "
                        "Keras applies before the cross-replica gradient sum; use a keras.optimizers optimizer")
    return None
  setting, value = settings[0] if settings else (None, None)  # Keras refuses more than one
  for key in CLIP_SETTINGS:
    setattr(inner, key, None)

  def sum_then_clip(grads_and_vars):
    pairs = dense_gradients(grads_and_vars)
    pairs = pairs if _SUMMED["depth"] else summed_by_dtype(summed, pairs)
    if setting is None:
      return pairs
    with tf.name_scope(CLIP_SCOPE):
      clipped = iter(_CLIPS[setting]([g for g, _ in pairs if g is not None], float(value)))
    return [(None if g is None else next(clipped), v) for g, v in pairs]

  private_apis.replace_gradient_sum(inner, sum_then_clip)
  inner.sum_taken_over = True
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    skip_steps_together(optimizer)
  return (setting, float(value)) if setting else None


def summed_by_dtype(summed, pairs):
  """summed(pairs) (Keras' cross-replica sum of the gradients), once per gradient dtype: TensorFlow's all-reduce
  concatenates the gradients into packs, which fails on variables of several dtypes (a float32 layer in a float64
  model). One dtype, the common case, is one call as before."""
  pairs = list(pairs)
  groups = {}
  for i, (g, _) in enumerate(pairs):
    if g is not None:
      groups.setdefault(g.dtype, []).append(i)
  if len(groups) < 2:
    return summed(pairs)
  result = list(pairs)
  for indices in groups.values():
    for i, pair in zip(indices, summed([pairs[i] for i in indices])):
      result[i] = pair
  return result


def skip_steps_together(optimizer):
  """A LossScaleOptimizer (float16) skips a step and halves its scale when the gradients are not finite; Keras 3
  checks them BEFORE the cross-replica sum: under MirroredStrategy replica 0's alone decide (another replica's
  overflow reaches the weights as inf), under MultiWorkerMirrored each worker decides for itself (the workers
  diverge, or one waits for the other's all-reduce). Here the check is agreed over every replica and worker with one
  scalar all-reduce, so N replicas skip exactly the steps one would (the sum is not finite when any part is not)."""
  local_check = optimizer.check_finite

  @tf.autograph.experimental.do_not_convert
  def check_finite(grads):
    finite = local_check(grads)
    context = tf.distribute.get_replica_context()
    if _SUMMED["depth"] or context is None or context.num_replicas_in_sync == 1:
      return finite  # the step summed the gradients itself (Task.transform_gradients), or nothing to agree with
    not_finite = context.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
    return tf.equal(not_finite, 0.0)

  optimizer.check_finite = check_finite


def dense_gradients(grads_and_vars):
  """Sparse gradients (tf.IndexedSlices: an Embedding's rows) as dense tensors (Horovod's sparse_as_dense), on any
  replica count. Keras' Adam squares a slice's rows before they are summed, so a token seen twice in a batch got
  g1^2 + g2^2 for (g1 + g2)^2 (1 vs 2 replicas differed 18x in the second moment); and TF 2.21's all-gather of
  slices fails when the replicas hold different numbers of rows (sequences padded per batch: "Shape mismatch in
  the collective ... expected shape [3456,16] but another member ... [4096,16]"). Costs a dense sum of the table."""
  return [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v) for g, v in grads_and_vars]


def _scaled(gradient, factor):
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype), gradient.indices,
                            gradient.dense_shape)
  return gradient * tf.cast(factor, gradient.dtype)


def _clip_global_norm(grads, clip):
  norm = tf.linalg.global_norm(grads)
  return [_scaled(g, clip / tf.maximum(norm, clip)) for g in grads]


def _clip_each_norm(grads, clip):
  return [_scaled(g, clip / tf.maximum(tf.linalg.global_norm([g]), clip)) for g in grads]


def _clip_values(grads, clip):
  clipped = lambda t: tf.clip_by_value(t, -clip, clip)
  return [tf.IndexedSlices(clipped(g.values), g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
          else clipped(g) for g in grads]


_CLIPS = {"global_clipnorm": _clip_global_norm, "clipnorm": _clip_each_norm, "clipvalue": _clip_values}


def set_constant_learning_rate(optimizer, learning_rate):
  """After a restore: a constant learning rate is a variable the checkpoint brought back; this run's value wins
  (a schedule is rebuilt from the config at each start and holds no state)."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
  if isinstance(inner.learning_rate, keras.Variable):  # a schedule's learning_rate is its value now, a tensor
    inner.learning_rate = learning_rate


def averages_weights(optimizer):
  """Whether the optimizer keeps moving averages of the weights (optimizer.ema_decay > 0); False for None."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
  return bool(getattr(inner, "use_ema", False))


def moving_averages(optimizer):
  """The optimizer's exponential moving averages of the trainable weights, or None when optimizer.ema_decay is 0."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
  return private_apis.moving_averages(inner) if getattr(inner, "use_ema", False) else None


@contextlib.contextmanager
def averaged_weights(model, optimizer):
  """Inside, the model's trainable weights are the optimizer's moving averages (eval, best checkpoint, export);
  its own weights come back bit for bit afterwards. A no-op without EMA. Runs the same on every process."""
  averages = moving_averages(optimizer)
  if not averages:
    yield
    return
  variables = model.trainable_variables
  own = [v.numpy() for v in variables]
  for variable, average in zip(variables, averages):
    variable.assign(average.numpy())
  try:
    yield
  finally:
    for variable, value in zip(variables, own):
      variable.assign(value)
