"""`main.py --check=replicas`: does this task and config compute on 2 replicas what it computes on 1?

Takes a few train steps with op determinism on, on one replica and on two (two GPUs when there are, else two
logical CPUs), the same global batches, the same global batch size and learning rate (a per-replica batch or a
replica-scaled learning rate is fixed at the two-replica value on both sides). Each step starts both sides from the
same weights and optimizer state (the one-replica side's), so rounding cannot grow from step to step, and compares
every model and optimizer variable's one-step update against what rounding explains at that step
(loops/rounding.py: the one-replica side once more with every weight moved by one rounding), up to the first step
that differs. Prints the largest differences and one last line with the verdict. Nothing is written.

What it catches: a loss reduced over the replica's batch (tf.reduce_mean, batch statistics, local negatives), a
gradient used before the all-reduce (SAM's epsilon, clipping in the step), randomness keyed on the replica, BatchNorm
statistics of the replica's rows, random layers drawing from Keras' seed state. A FAIL names its cause: inf or NaN
on one side or both first (no sum order makes a finite value infinite); then the first layer whose output differs
at the first step that differs (loops/first_difference.py), or the per-example loss, or the gradients; the suspects
the build shows (unsynchronized BatchNorm, unkeyed random layers) turned off one at a time on both sides, the one
whose absence makes them agree named as confirmed; gradient clipping ops in the step.
"""

import contextlib
import dataclasses
import re
import time

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from configs import settings as settings_lib
from errors import ConfigError, first_line
from loops import build as build_lib
from loops import rules as rules_lib
from loops import first_difference
from loops import rounding
from loops import ties
from loops.distribute import cluster
from loops.distribute import execution as execution_lib
from loops.distribute import strategy as strategy_lib
from loops.modeling import model as model_lib
from loops.modeling import optimizers as optimizers_lib
from loops.modeling import random_layers
from loops import private_apis

STEPS = 3
OTHERS = 2  # replicas (or workers) of the other side
SIDES = {"replicas": ("1", "2 replicas"), "workers": ("1 device", "2 workers")}


def variant(config, replicas, steps):
  """The config on `replicas` replicas of this machine, deterministic, for `steps` steps, no tf.data service, at the
  settings both sides share (like_with_like)."""
  c = like_with_like(config)
  gpus = len(tf.config.list_physical_devices("GPU"))
  c.strategy = "mirrored" if replicas > 1 else "one_device"
  if gpus >= 2:
    c.cpu_replicas, c.num_gpus = 0, replicas
  else:
    c.cpu_replicas = replicas
  c.deterministic = not c.jit_compile  # XLA's MaxPool gradient refuses op determinism (CPU XLA is deterministic)
  c.data.service = ""
  c.train.steps, c.train.epochs, c.train.steps_per_loop = steps, None, steps
  return c


def like_with_like(config, others=OTHERS):
  """The config both sides run: the global batch and learning rate the other side's `others` replicas get (a
  per-replica batch and a replica-scaled learning rate would otherwise differ by design); the scaling rule then off."""
  c = config.copy_and_resolve_references()
  if c.train.global_batch_size is None and c.train.per_replica_batch_size:
    c.train.global_batch_size, c.train.per_replica_batch_size = c.train.per_replica_batch_size * others, None
  if c.optimizer.lr_scaling != "none":
    c.optimizer.learning_rate = optimizers_lib.scaled_learning_rate(c.optimizer, c.train.global_batch_size, others)
    c.optimizer.lr_scaling = "none"
  return c


def check_split(config, kind="replicas"):
  """ConfigError when the global batch both sides run does not split over the other side's replicas or workers
  (said before either side is built)."""
  batch = like_with_like(config).train.global_batch_size
  if batch is not None and batch % OTHERS:
    raise ConfigError(f"global batch size {batch} is not divisible by the check's {OTHERS} {kind}; use a multiple of "
                      f"{OTHERS}")


def settings_line(config, kind="replicas", others=OTHERS):
  """What both sides run, said before the verdict: the global batch, the learning rate and where they come from."""
  c = like_with_like(config, others)
  line = f"both sides: global batch {c.train.global_batch_size}"
  if config.train.global_batch_size is None and config.train.per_replica_batch_size:
    line += f" (train.per_replica_batch_size={config.train.per_replica_batch_size} x {others} {kind})"
  line += f", learning rate {c.optimizer.learning_rate:g}"
  if config.optimizer.lr_scaling != "none":
    line += f" (optimizer.lr_scaling={config.optimizer.lr_scaling} at {others} {kind}, on both)"
  return line


@dataclasses.dataclass(frozen=True)
class Suspects:
  """What in a build makes N replicas differ from one by construction (paths), and clipping ops in its step."""
  batchnorm: tuple = ()  # BatchNormalization layers of trained models, not synchronized: the replica's statistics
  random: tuple = ()  # layers drawing from Keras' seed state (one draw for every replica) that take `training`
  clipping: tuple = ()  # gradient clipping in the step (name scopes), before the optimizers' cross-replica sum


class Side:
  """One side of a check: a build of the config whose steps are taken one at a time, from its own state or from
  given ones. turn_off: suspects removed first ("batchnorm": synchronized, "random": in inference mode); role: this
  process's cluster.ClusterRole (a worker of loops/worker_check.py), default local; strategy: as build_lib.build's
  (None: started for this config)."""

  def __init__(self, config, turn_off=(), role=None, strategy=None):
    rules_lib.check(config)
    settings = settings_lib.read(config)
    strategy_lib.configure_devices(settings.run)
    self.config = config
    self.parts = build_lib.build_from(settings, config, role or cluster.ClusterRole(), strategy=strategy,
                                      log_config=False)  # the check logs the user's once
    _turn_off(self.parts, turn_off)
    self.variables = _named_variables(self.parts)
    self.paths = {key: f"{key[0]}: {v.path}" for key, v in self.variables.items()}
    self.execution = execution_lib.make(self.parts, settings.run, settings.preemption)
    self.taken = 0  # steps taken: the batches read

  def state(self):
    return {key: v.numpy().copy() for key, v in self.variables.items()}

  def load(self, state, nudge=0.0):
    """Every variable set to `state` (those it holds); with nudge, each model weight then moved by that relative
    size, up or down at random (seeded)."""
    for key, variable in self.variables.items():
      if key not in state:
        continue
      value = state[key]
      if nudge and key[0].startswith("model") and value.dtype.kind == "f":
        rng = np.random.default_rng([self.config.seed, key[1], len(key[0])])
        value = value * (1 + rng.choice(np.array([-nudge, nudge], value.dtype), value.shape))
      variable.assign(value)

  def step(self, start=None, nudge=0.0):
    """(start, final) of one step: from its own state, or from `start` (nudged)."""
    if start is not None:
      self.load(start, nudge)
    begun = self.state()
    self.execution.train(1)
    self.taken += 1
    return begun, self.state()

  def step_at(self, k, start, nudge=0.0):
    """(start, final) of step k (0-based) from `start` (nudged): the batches of the steps before it that this side
    was not asked to take are taken first."""
    self.advance(k - self.taken)
    return self.step(start, nudge)

  def advance(self, count):
    """Takes `count` steps from its own state (to reach a step's batch)."""
    if count > 0:
      self.execution.train(count)
      self.taken += count

  def built(self):
    """What a judgement needs of this build once its steps are taken: Built."""
    return Built(self.paths, self.suspects(),
                 {place: layer.path for place, layer in first_difference.places(self.parts.models).items()},
                 tuple(layer.path for layer in ties.max_pools(self.parts.models)))

  def suspects(self):
    return Suspects(batchnorm=tuple(l.path for l in _unsynchronized_batchnorm(self.parts)),
                    random=tuple(l.path for m in self.parts.models.values() for l in random_layers.unkeyed(m)
                                 if random_layers.can_turn_off(l)),
                    clipping=clipping_scopes(self.execution.train_graph_def(1)))


@dataclasses.dataclass(frozen=True)
class Built:
  """Of the one-device side's build: variable paths by key, its Suspects, its layers' paths by place, its max
  pools' paths (loops/ties.py)."""
  paths: dict
  suspects: Suspects
  layers: dict
  pools: tuple = ()


def trained_values(config, steps, role=None, strategy=None):
  """{key: (initial, final, path)} of every model and optimizer variable after `steps` steps in one call."""
  side = Side(config, role=role, strategy=strategy)
  initial = side.state()
  side.execution.train(steps)
  final = side.state()
  return {key: (initial[key], final[key], side.paths[key]) for key in initial}


def _unsynchronized_batchnorm(parts):
  return [layer for model in parts.models.values() if model.trainable
          for layer in private_apis.all_layers(model, include_self=False)
          if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable and not layer.synchronized]


def _turn_off(parts, kinds):
  for model in parts.models.values():
    if "batchnorm" in kinds:
      model_lib.synchronize_batchnorm(model)
    if "random" in kinds:
      for layer in random_layers.unkeyed(model):
        if random_layers.can_turn_off(layer):
          random_layers.in_inference_mode(layer)


def clipping_scopes(graph_def):
  """The name scopes of gradient clipping (tf.clip_by_global_norm, tf.clip_by_norm) in a traced step, but for the
  optimizers' own clipping after the sum (loops/modeling/optimizers.py)."""
  names = [node.name for node in graph_def.node] + [
      node.name for function in graph_def.library.function for node in function.node_def]
  scopes = {re.sub(r"^(.*?clip_by_(?:global_)?norm(?:_\d+)?)/.*$", r"\1", name) for name in names
            if re.search(r"clip_by_(global_)?norm", name) and optimizers_lib.CLIP_SCOPE not in name}
  return tuple(sorted(scopes))


def _named_variables(parts):
  """{(owner, index): variable} in creation order (Keras numbers repeated layer names per process, so the second
  build's paths differ: the order does not); trainable variables of models, then optimizer slots. A float16
  LossScaleOptimizer's slots are numbered as its inner optimizer's, its own (the loss scale) below 0: a float32
  build of the same config (its step in the precision above) holds the same slots under the same keys."""
  named = {}
  for name, model in parts.models.items():
    for i, variable in enumerate(model.variables):
      named[(f"model {name}", i)] = variable
  for name, optimizer in parts.optimizers.items():
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    own = [v for v in optimizer.variables if not any(v is w for w in inner.variables)]
    for i, variable in [*enumerate(inner.variables), *((-1 - j, v) for j, v in enumerate(own))]:
      if "iteration" not in variable.path:
        named[(f"optimizer {name}", i)] = variable
  return named


@dataclasses.dataclass(frozen=True)
class Floor:
  """How what rounding explains was measured: "float64" (the one-device step again in float64: its own float32
  error) or "nudge" (again with every weight moved by one rounding: a step that does not run in float64, or a
  float16/bfloat16 one), and why not float64."""
  how: str
  why_not: str = ""
  kept: tuple = ()  # the float64 build's layers that its models pin to float32 (a logits layer)

  def described(self, side, precision):
    if self.how == "minimum":
      return (f"at least the least difference judged, {rounding.MINIMUM[precision]:g} of a variable's update: within "
              f"it, no floor run")
    if self.how == "float64":
      return f"the {side} side's own float32 error: its step again in float64{self.kept_said()}"
    text = f"the {side} side's step again with every weight moved by one rounding of {precision or 'float32'}"
    return text + (f" (it does not run in float64: {self.why_not})" if self.why_not else "")

  def kept_said(self):
    """What of the float64 step stayed float32, as the report says it ("" when nothing did)."""
    if not self.kept:
      return ""
    listed = ", ".join(self.kept[:3]) + (f" and {len(self.kept) - 3} more" if len(self.kept) > 3 else "")
    return f", but for {listed}, which the model keeps in float32"


def float32_layers(side):
  """The layers of a float64 build's models whose weights stay float32 (a weight added with dtype float32)."""
  layers = [variable.path.rsplit("/", 1)[0] for key, variable in side.variables.items()
            if key[0].startswith("model") and variable.dtype == tf.float32]
  return tuple(dict.fromkeys(layers))


@contextlib.contextmanager
def float64_models():
  """Keras layers and optimizers built inside compute and keep float64 (the dtype policy is global), layers that
  their model pins to float32 (a logits layer) too: the step has no float32 rounding left to measure itself by."""
  previous = keras.mixed_precision.dtype_policy()
  keras.mixed_precision.set_dtype_policy("float64")
  try:
    with private_apis.float32_pins_as("float64"):
      yield
  finally:
    keras.mixed_precision.set_dtype_policy(previous)


# The precision above a run's, in which the check takes a step again where rounding alone cannot decide: float32's
# own error is measured in float64; each step of a float16 or bfloat16 check is judged again as a float32 check
# (AboveJudge; float16's loss scale aside: _named_variables).
HIGHER = {None: "float64", "bfloat16": "float32", "float16": "float32"}


@contextlib.contextmanager
def higher_precision(config):
  """The config to build inside for its step in the precision above (HIGHER): float64 Keras models for a float32
  config, the config without mixed precision for a float16 or bfloat16 one."""
  if config.mixed_precision is None:
    with float64_models():
      yield config
  else:
    above = config.copy_and_resolve_references()
    above.mixed_precision = None
    yield above


def floor_side(config, turn_off=(), float64=True):
  """(Side, nudge) of the floor run: built in float64 when float64 and the config is float32 (nudge 0), else the
  config's precision with the nudge of one rounding."""
  if float64 and config.mixed_precision is None:
    with float64_models():
      return Side(config, turn_off), 0.0
  return Side(config, turn_off), rounding.NUDGE[config.mixed_precision]


def shortened(text, size=100):
  return text if len(text) <= size else text[:size - 3] + "..."


class FloorRun:
  """The floor's side, built when a step first needs it and taking each step asked of it from the same start as
  the check's sides: in float64 where the step runs in it (a float32 config), else nudged (said with the reason)."""

  def __init__(self, config, turn_off=()):
    self.config, self.turn_off = config, turn_off
    self.side, self.nudge, self.how = None, 0.0, Floor("minimum")

  def step(self, k, start):
    """(start, final) of step k (0-based) from `start`."""
    if self.side is None and self.config.mixed_precision is None:
      try:
        return self._step(k, start, float64=True)
      except Exception as e:  # pylint: disable=broad-except  # a step of float32 constants of its own: said, nudged
        self.side, self.how = None, Floor("nudge", shortened(first_line(e)))
    return self._step(k, start, float64=False)

  def _step(self, k, start, float64):
    if self.side is None:
      self.side, self.nudge = floor_side(self.config, self.turn_off, float64)
      self.how = Floor("float64", kept=float32_layers(self.side)) if float64 else Floor("nudge", self.how.why_not)
    return self.side.step_at(k, start, self.nudge)


class OtherFloor:
  """The two-replica side's own rounding error: its step again in the precision above (HIGHER) on 2 replicas from
  the same start, built when a step first exceeds what the one-replica side's own error explains (a weight added
  with dtype="float32" has its gradients summed apart from the float64 ones: optimizers.summed_by_dtype)."""

  def __init__(self, config, turn_off=()):
    self.config, self.turn_off, self.side, self.why_not = config, turn_off, None, ""

  def step(self, k, start):
    """(start, final) of step k (0-based) from `start` in the precision above, or None when it does not run in it."""
    if self.why_not:
      return None
    try:
      if self.side is None:
        devices = strategy_lib.replica_devices(settings_lib.read(self.config).run)
        with higher_precision(self.config) as above:
          self.side = Side(above, self.turn_off, strategy=strategy_lib.mirrored(devices))
      return self.side.step_at(k, start)
    except Exception as e:  # pylint: disable=broad-except  # as the one-replica floor's: judged without it
      self.why_not = shortened(first_line(e))
      return None

  def above(self):
    """The OtherFloor of this side's config in the precision above (a float16 or bfloat16 check's float32 Judge's)."""
    with higher_precision(self.config) as above:
      return OtherFloor(above, self.turn_off)


class TieRun:
  """The step again on one device with its max pools' near ties flipped (loops/ties.py), built when a step first
  exceeds its floor and the models hold max pooling; without XLA (the flip's ops do not compile)."""

  def __init__(self, config, turn_off=()):
    self.config, self.turn_off, self.side = _probed(config.copy_and_resolve_references()), turn_off, None

  def step(self, k, start):
    """(start, final) of step k (0-based) from `start`, ties flipped."""
    if self.side is None:
      self.side = Side(self.config, self.turn_off)
      ties.flip_ties(self.side.parts.models, rounding.MINIMUM[self.config.mixed_precision])
    return self.side.step_at(k, start)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """The verdict of every step, the build it judged, how rounding was measured, the first step that differs
  (1-based; its start and both sides' finals), else None, and the steps only max-pool ties explain."""
  verdict: rounding.Verdict
  built: Built
  how: Floor
  first: tuple = None
  tied: tuple = ()
  both: tuple = ()  # (step, the sides' largest difference in the precision above) where both sides' errors were measured
  unmeasured: str = ""  # why the two-replica side's own error could not be measured where a step needed it
  in_float32: tuple = ()  # a float16/bfloat16 check's steps judged in float32 (AboveJudge): each that runs there
  skipped: tuple = ()  # float16 steps one side's loss scaling skipped (an overflow there only): not compared


def step_rows(step, start, final_one, final_two, floor, paths, precision=None, margin=rounding.MARGIN):
  """[rounding.Row] of one step (1-based) from `start`: floor is the floor run's (start, final), what it explains
  taken `margin` times; a key only one side has differs without bound."""
  common = {key: start[key] for key in start if key in final_two}
  rows = rounding.step_rows(step, rounding.updates(common, final_one), rounding.updates(common, final_two),
                            rounding.updates(*floor), paths, rounding.MINIMUM[precision], margin)
  return rows + [rounding.Row(step, f"{paths.get(key, key)} (only on one side)", float("inf"), 0.0)
                 for key in sorted(set(start) ^ set(final_two))]


def judged(one, two, floor, paths, precision=None):
  """The rounding.Verdict of every step: one [(start, final)], two [final], floor [(start, final)]."""
  return rounding.Verdict(tuple(row for k, ((start, final), final_two, floor_step) in enumerate(zip(one, two, floor))
                                for row in step_rows(k + 1, start, final, final_two, floor_step, paths, precision)))


class Judge:
  """Judges a check one step at a time as its sides take them, keeping each variable's rows and the first step that
  differs, not the states: against the least difference judged, then, where a variable exceeds it, against the
  floor run from the same start."""

  def __init__(self, floor_config, paths, turn_off=(), pools=(), other=None):
    self.floor, self.paths, self.precision = FloorRun(floor_config, turn_off), paths, floor_config.mixed_precision
    self.ties = TieRun(floor_config, turn_off) if pools else None
    self.other = other  # the other side's step above (OtherFloor; worker_check.WorkersFloor), None: not measured
    self.above = (AboveJudge(floor_config, paths, turn_off, pools, other)
                  if other and floor_config.mixed_precision in ("bfloat16", "float16") else None)
    self.rows, self.first, self.tied, self.both, self.in_float32, self.skipped = [], None, [], [], [], []

  def step(self, k, start, final_one, final_two):
    if self.precision == "float16" and skipped(start, final_one) != skipped(start, final_two):
      self.skipped.append(k + 1)  # float16 overflowed on one side only: that side's loss scaling skipped the step
      return
    rows = step_rows(k + 1, start, final_one, final_two, (start, final_one), self.paths, self.precision)
    # every step: a mistake smaller than bfloat16's rounding (PartlyCentred: 5.4e-2 where correct code differs by
    # 4.0e-2) differs in float32, at whichever step it first shows there (step 2 on 2 workers); not a float16 step
    # both sides skipped (an overflow float32 would not have: the step float16 takes is no step)
    both_skipped = self.precision == "float16" and skipped(start, final_one)
    in_float32 = self.above.rows(k, start) if self.above and not both_skipped else None
    if in_float32 is not None:
      rows = in_float32
      self.in_float32.append(k + 1)
    elif any(row.differs for row in rows):
      floor = self.floor.step(k, start)
      rows = step_rows(k + 1, start, final_one, final_two, floor, self.paths, self.precision)
      if self.other and self.floor.how.how == "float64" and any(row.differs for row in rows):
        rows = self._both_sides(k, start, final_one, final_two, floor, rows)
    # the flips' move as measured, beside rounding's own (rows judged in float32 had their float32 flips there)
    if self.ties and in_float32 is None and any(row.differs for row in rows):
      rows = rounding.summed(rows, step_rows(k + 1, start, final_one, final_two, self.ties.step(k, start),
                                             self.paths, self.precision, margin=1.0))
      self.tied += [k + 1] if not any(row.differs for row in rows) else []
    self.rows += rows
    if self.first is None and any(row.differs for row in rows):
      self.first = (k + 1, start, final_one, final_two)

  def _both_sides(self, k, start, final_one, final_two, floor, rows):
    """The rows where each side's own float32 error, summed (x rounding.BOTH_MARGIN), explains more: when both
    sides' float64 steps agree, their float32 steps cannot differ by more than that sum (the triangle inequality)."""
    other = self.other.step(k, start)
    if other is None:
      return rows
    margin = rounding.BOTH_MARGIN
    both = rounding.summed(
        step_rows(k + 1, start, final_one, final_two, floor, self.paths, self.precision, margin),
        step_rows(k + 1, start, final_two, final_one, other, self.paths, self.precision, margin))
    agree = step_rows(k + 1, start, floor[1], other[1], floor, self.paths, self.precision)
    self.both.append((k + 1, max(row.difference for row in agree)))
    # every row of the step against the wider of the two rules, as judged (a row within the one-sided floor read
    # as 0.997 of it at step 297 of a 300-step ResNet-20 check where the summed errors allowed more)
    return [row if row.explained >= wider.explained else wider for row, wider in zip(rows, both)]

  def comparison(self, built):
    """The Comparison; where steps were judged in float32, how that judgement measured rounding is the check's."""
    inner = self.above.judge if self.in_float32 else self
    return Comparison(rounding.Verdict(tuple(self.rows)), built, inner.floor.how, self.first,
                      tuple(self.tied + (inner.tied if inner is not self else [])),
                      tuple(self.both + (inner.both if inner is not self else [])),
                      inner.other.why_not if inner.other else "", tuple(self.in_float32), tuple(self.skipped))


def skipped(start, final):
  """Whether no model weight moved in a step (float16's loss scaling skips a step whose gradients overflowed)."""
  return all(np.array_equal(start[key], final[key]) for key in final if key[0].startswith("model") and key in start)


class AboveJudge:
  """Each step of a float16 or bfloat16 check taken again on both sides in float32 from the same start (the
  one-device side built here, the other's from `other`: OtherFloor, worker_check.WorkersFloor) and judged by a float32
  Judge (its float64 floor, the other side's float64 step where `other` offers one). bfloat16's own rounding is ~1 %
  of an update and moves with every weight (its nudged floor was 27 % of the regression example's, float16's 82 %):
  no floor measures it closely enough, while a difference of the step itself shows in float32 too."""

  def __init__(self, config, paths, turn_off, pools, other):
    with higher_precision(config) as above:
      self.config = above
    self.turn_off, self.other, self.side = turn_off, other, None
    self.judge = Judge(self.config, paths, turn_off, pools, other.above() if hasattr(other, "above") else None)

  def rows(self, k, start):
    """The float32 judgement's rows of step k (0-based), or None when a side's step does not run in float32."""
    two = self.other.step(k, start)
    if two is None:
      return None
    if self.side is None:
      self.side = Side(self.config, self.turn_off)
    final = self.side.step_at(k, start)[1]
    start = {key: start[key] for key in final}  # without float16's loss scale: a float32 build has none
    self.judge.step(k, start, final, two[1])
    return [row for row in self.judge.rows if row.step == k + 1]


def compare(config, steps, turn_off=(), through=None):
  """The Comparison of 1 vs 2 replicas of this process, both sides taking each step from the one side's start, up
  to the first step where a variable differs (the verdict and its cause are settled there), or step `through`
  (1-based; the config still runs `steps`: its schedules are the check's)."""
  one_config = variant(config, 1, steps)
  one, two = Side(one_config, turn_off), Side(variant(config, 2, steps), turn_off)
  judge = Judge(one_config, one.paths, turn_off, ties.max_pools(one.parts.models),
                OtherFloor(variant(config, 2, steps), turn_off))
  progress = StepsJudged(through or steps)
  for k in range(through or steps):
    start, final = one.step()
    judge.step(k, start, final, two.step(start)[1])
    if judge.first:
      break
    progress.judged(k)
  return judge.comparison(one.built())


class StepsJudged:
  """Logs `check: K of N steps judged` at most every `seconds` while a check runs."""

  def __init__(self, steps, seconds=10.0):
    self.steps, self.seconds, self.last = steps, seconds, time.monotonic()

  def judged(self, k):
    """Step k (0-based) is judged."""
    if time.monotonic() - self.last >= self.seconds:
      logging.info("check: %d of %d steps judged", k + 1, self.steps)
      self.last = time.monotonic()


def non_finite(one, two):
  """{path: "one", "two" or "both"}: the variables whose final values hold inf or NaN on that side."""
  sides = {}
  for key, (_, final_one, path) in one.items():
    if key in two:
      bad = (not np.all(np.isfinite(final_one)), not np.all(np.isfinite(two[key][1])))
      if any(bad):
        sides[path] = "both" if all(bad) else "one" if bad[0] else "two"
  return sides


def non_finite_at(comparison):
  """non_finite of both sides' finals at the first step that differs."""
  _, start, final, final_two = comparison.first
  path = comparison.built.paths
  return non_finite({key: (start[key], final[key], path[key]) for key in final},
                    {key: (start[key], final_two[key], path[key]) for key in final_two if key in start})


def non_finite_cause(sides, kind="replicas", shown=3):
  """The cause a FAIL names when a side's updates hold inf or NaN (None when neither's do): a sum in another order
  cannot make a finite value infinite, so no reduction, BatchNorm or random layer is to blame for that."""
  if not sides:
    return None
  one, two = {"replicas": ("1 replica", "2 replicas")}.get(kind, SIDES[kind])
  paths = sorted(sides)
  listed = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
  if all(side == "both" for side in sides.values()):
    return (f"cause: both runs' variables hold inf or NaN ({listed}): the step diverges on {one} too, so they "
            f"cannot be compared; lower the learning rate or fix the loss on one device first")
  finite, infinite = (one, two) if "two" in sides.values() else (two, one)
  return (f"cause: the variables hold inf or NaN on {infinite} where they are finite on {finite} ({listed}): a "
          f"value overflowed or was divided by zero on a part of the batch only (a count, norm or sum over one "
          f"replica's rows that can be zero; float16 overflowing on one replica)")


REDUCTION = ("the step reduces over the replica's own batch somewhere (see loops/task/context.py: ctx.average, "
             "ctx.all_gather, ctx.sum_over_replicas, ctx.normal)")


def report(verdict, steps, kind="replicas", cause=REDUCTION, floor=Floor("float64"), precision=None, shown=8,
           tied=(), both=(), unmeasured="", in_float32=(), skipped=()):
  """(passed, lines): the largest differences over what rounding explains, the verdict last (a FAIL with its
  first step and cause). kind: "replicas" (1 vs 2 replicas of one process) or "workers" (one device vs 2 worker
  processes); floor: how rounding was measured; tied: the steps only flipped max-pool ties explain; both: (step,
  the steps' largest difference in the precision above) where the other side's own error was measured too;
  unmeasured: why it could not be, where a step needed it; in_float32: a float16/bfloat16 check's steps judged in
  float32 (then said as a float32 check's); skipped: float16 steps skipped on one side only, not compared."""
  one, two = SIDES[kind]
  own, other = ("one-replica", "two-replica side") if kind == "replicas" else ("one-device", "two workers' side")
  half, precision = (precision, None) if in_float32 else (None, precision)
  measured = floor.described(own, precision)
  taken = max((row.step for row in verdict.rows), default=steps)
  each = f"each of {steps} steps" if taken >= steps else (
      (f"step 1 of {steps}" if taken == 1 else f"each of the first {taken} of {steps} steps") +
      " (the check stops at the first step that differs)")
  lines = [f"{each} from the same weights; the one-step updates' RMS difference per variable, "
           f"against what rounding explains ({measured}; x{rounding.MARGIN:g}):"]
  lines += [f"  step {row.step:<3d} {row.difference:9.2e} of {row.explained:9.2e}  {row.path}"
            for row in verdict.worst(shown)]
  compute, above = precision or "float32", HIGHER.get(precision, "float64")
  if both:
    lines.append(f"  {_steps([step for step, _ in both])}: beyond that, so the {other}'s own {compute} "
                 f"error was measured too (its step again in {above}{floor.kept_said()}) and both sides' summed, "
                 f"x{rounding.BOTH_MARGIN:g}; their {above} steps differ by at most "
                 f"{max(value for _, value in both):.2e}")
  if unmeasured:
    lines.append(f"  the {other}'s own {compute} error could not be measured (its step does not run in "
                 f"{above} on {two}: {unmeasured}): judged against the {own} side's alone")
  if in_float32:
    lines.append(f"  {_steps(list(in_float32))}: taken again on both sides in float32 from the same weights, judged "
                 f"as a float32 check judges it: {half}'s rounding is gone there, a difference of the step stays")
  if skipped:
    lines.append(f"  {_steps(list(skipped))}: not compared: float16 overflowed on one side only (its partial sums "
                 f"differ with the batch's split), whose loss scaling skipped the step and halved the scale")
  if tied:
    lines.append(f"  {_steps(tied)}: beyond the floor, but within what flipping the "
                 f"max pools' near ties explains (windows whose two largest are within "
                 f"{rounding.MINIMUM[precision]:g} of each other: rounding picks which takes the gradient)")
  worst, = verdict.worst(1) or [None]
  if worst is None:  # nothing compared: no variables, or every step skipped on one side (float16)
    return not skipped, lines + [f"{kind}: FAIL: float16 overflowed on one side only at every step, which its loss "
                                 f"scaling skipped: nothing was compared (an inf or NaN of one side's rows does this "
                                 f"too); check it in float32: --config.mixed_precision=None" if skipped else
                                 f"{kind}: PASS: there are no variables to compare"]
  if verdict.passed:
    where = f"in {worst.path} at step {worst.step}"
    measured = (f"rounding explains up to {worst.explained:.2e}; the sides differ by {worst.difference:.2e} {where}"
                if floor.how != "minimum" else f"the sides differ by at most {worst.difference:.2e} {where}, within "
                f"the least difference judged, {worst.explained:.2e}: no floor run needed")
    lines.append(f"{kind}: PASS: {one} and {two} agree on all {verdict.variables} variables at each of {steps} "
                 f"steps ({measured})")
    return True, lines
  step = verdict.first_step
  beyond = verdict.variables_beyond(step)
  first, = verdict.worst(1, step)
  lines.append(f"{kind}: FAIL: {len(beyond)} of {verdict.variables} variables differ on {two} from step {step} "
               f"(rounding explains up to {first.explained:.2e}; the sides differ by {first.difference:.2e} in "
               f"{first.path}): {cause}")
  return False, lines


def _steps(steps, shown=5):
  """'step 3' or 'steps 3, 7 and 2 more'."""
  listed = ", ".join(str(step) for step in steps[:shown])
  return f"step{'s' if len(steps) > 1 else ''} {listed}" + (
      f" and {len(steps) - shown} more" if len(steps) > shown else "")


def diagnose(suspects):
  """The likely cause a FAIL names when no rerun locates it (--check=workers): clipping in the step, else the
  suspects of the build, else the step's own reductions."""
  if suspects.clipping:
    return (f"likely cause: the step clips gradients before the cross-replica sum ({', '.join(suspects.clipping)}); "
            f"fix: {FIXES['clipping']}")
  found = [kind for kind in ("batchnorm", "random") if getattr(suspects, kind)]
  if found:
    return "likely cause: " + "; ".join(f"{_described(k, suspects)} (fix: {FIXES[k]})" for k in found)
  return REDUCTION


def _described(kind, suspects, shown=3):
  paths = getattr(suspects, kind)
  listed = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
  return f"{WHAT[kind]} ({listed})"


WHAT = {"batchnorm": "BatchNormalization with each replica's own batch statistics",
        "random": "random layers drawing the same values on every replica (Keras' seed state)"}
TURNED_OFF = {"batchnorm": "synchronized", "random": "in inference mode"}
FIXES = {
    "batchnorm": ("--config.model.sync_batchnorm=True (every model of the task), or accept per-replica statistics "
                  "(a difference by design, not a bug)"),
    "random": ("Dropout, SpatialDropout, GaussianNoise, GaussianDropout and AlphaDropout draw per example; draw "
               "other noise in the step with ctx.normal or ctx.keyed_draws"),
    "clipping": ("clip with optimizer.global_clipnorm or ctx.optimizer(global_clipnorm=...), which clips the "
                 "gradient summed over replicas"),
}


def steps_for(config):
  """check.steps, or by default enough steps to reach every branch the task declares: at least STEPS, and the
  least common multiple of its Task.update_every periods (k=5: steps 0-4, the last one updating that model)."""
  steps = config.check.steps
  if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
    raise ConfigError(f"check.steps must be a whole number >= 1 (0: enough to reach every branch the task "
                      f"declares), got {steps!r}")
  if steps:
    return steps
  from loops import task as task_lib  # pylint: disable=import-outside-toplevel
  from loops.task import rules as task_rules  # pylint: disable=import-outside-toplevel
  task_rules.check_task_settings(config)
  return max(STEPS, task_lib.update_span(config.task.name))


OTHER_STRATEGIES = {
    "multi_worker_mirrored": "; --check=workers runs it on 2 worker processes",
    "parameter_server": ("; parameter_server applies each worker's update on its own, so no run of it equals one "
                         "device: this proves the step, not the asynchrony"),
}


def run(config, steps=None, out=print):
  """Runs both sides and prints the report; returns True when they agree. steps: default steps_for(config)."""
  steps = steps or steps_for(config)
  if config.strategy not in ("one_device", "mirrored"):
    out(f"note: strategy={config.strategy}: this check runs the same step on one_device and on mirrored x2 in "
        f"this process{OTHER_STRATEGIES.get(config.strategy, '')}")
  strategy_lib.configure_devices(settings_lib.read(variant(config, 2, steps)).run)  # both logical CPUs before TF starts
  rules_lib.check(variant(config, 2, steps))  # a setting the two-replica side refuses: one line, before training
  check_split(config)
  build_lib.logged_config(config)
  out(settings_line(config))
  with build_lib.determinism_restored():
    comparison = compare(config, steps)
    cause = REDUCTION if comparison.verdict.passed else cause_of(config, steps, comparison)
  passed, lines = report(comparison.verdict, steps, cause=cause, floor=comparison.how,
                         precision=config.mixed_precision, tied=comparison.tied, both=comparison.both,
                         unmeasured=comparison.unmeasured, in_float32=comparison.in_float32,
                         skipped=comparison.skipped)
  for line in lines:
    out(line)
  return passed


def cause_of(config, steps, comparison):
  """What a FAIL names: inf or NaN first; else where the sides part (loops/first_difference.py), a suspect found
  there confirmed by turning it off on both sides."""
  step = comparison.first[0]
  cause = non_finite_cause(non_finite_at(comparison))
  if cause:
    return cause
  logging.info("check: the sides differ at step %d: finding where they part (both sides and the floor built again "
               "without XLA, every layer's output recorded)", step)
  finding, task = locate(config, steps, comparison)
  sentence = first_difference.described(finding, task, config.loss.name, config.task.name, step,
                                        nudged=comparison.how.how == "nudge" and config.mixed_precision is None)
  return named_cause(finding, sentence, comparison.built.suspects, confirmed_without(config, steps, step), step)


def locate(config, steps, comparison):
  """(first_difference.Finding, the task) at the check's first differing step: both sides and the floor run built
  again without XLA (a recorded step cannot be compiled), each taking the steps before it on its own (their
  batches) and that step from the check's start."""
  step, start, _, _ = comparison.first
  float64 = comparison.how.how == "float64"
  if step in comparison.in_float32:  # a float16/bfloat16 step judged in float32: located in float32 too
    with higher_precision(config) as above:
      config = above  # comparison.how is then the float32 judgement's
  side_of = lambda replicas: lambda: Side(_probed(variant(config, replicas, steps)))
  one, task = first_difference.recorded(side_of(1), step, start)
  two, _ = first_difference.recorded(side_of(2), step, start)
  floor_of = lambda: floor_side(_probed(variant(config, 1, steps)), float64=float64)[0]
  nudge = 0.0 if float64 else rounding.NUDGE[config.mixed_precision]
  floor, _ = first_difference.recorded(floor_of, step, start, nudge)
  finding = first_difference.first(one, two, floor, rounding.MINIMUM[config.mixed_precision])
  place = finding.place.split("#")[0]
  inputs = place.endswith(first_difference.INPUTS)
  path = comparison.built.layers.get(place[:-len(first_difference.INPUTS)] if inputs else place)
  if path:  # the path as the check's own build numbered it (Keras numbers paths per process)
    call = finding.where.rsplit(" (call ", 1)
    where = ("the inputs of " if inputs else "") + path + (f" (call {call[1]}" if len(call) > 1 else "")
    finding = dataclasses.replace(finding, where=where)
  return finding, task


def _probed(config):
  config.jit_compile, config.deterministic = False, True
  return config


def confirmed_without(config, steps, step):
  """agree_without(kind) of named_cause: whether both sides agree with that suspect turned off on both, through the
  step where they parted (1-based; later steps were not judged either)."""
  return lambda kind: compare(config, steps, (kind,), through=step).verdict.passed


def named_cause(finding, where, suspects, agree_without, step):
  """The cause of a FAIL from where the sides part (at `step`, 1-based): a suspect of the build found there is
  confirmed (or not) by turning it off on both sides through that step (agree_without(kind)); clipping ops in the
  step name the likely cause of differing gradients."""
  kind = finding.kind
  if kind in ("batchnorm", "random") and getattr(suspects, kind):
    logging.info("check: confirming the cause: both sides again with %s %s",
                 {"batchnorm": "BatchNormalization", "random": "the random layers"}[kind], TURNED_OFF[kind])
    if agree_without(kind):
      return (f"cause: {_described(kind, suspects)} (confirmed: {TURNED_OFF[kind]}, the two agree through step "
              f"{step}); fix: {FIXES[kind]}; {where}")
    return (f"cause: {where} ({_described(kind, suspects)} {TURNED_OFF[kind]}: the sides still differ beyond "
            f"rounding, so not the only cause)")
  if kind == "gradients" and suspects.clipping:
    return (f"likely cause: the step clips gradients before the cross-replica sum ({', '.join(suspects.clipping)}); "
            f"fix: {FIXES['clipping']}; {where}")
  return f"cause: {where}"
