"""`main.py --check=replicas`: does this task and config compute on 2 replicas what it computes on 1?

Runs a few train steps from the same initial weights with op determinism on, once on one replica and once on two
(two GPUs when there are, else two logical CPUs), the same global batches, and compares every model and optimizer
variable by its path: the relative difference of the two runs' UPDATES (final - initial), so a wrong reduction
shows even when the weights barely moved. Prints the largest differences, the first variable beyond the tolerance,
and one last line with the verdict. Nothing is written.

What it catches: a loss reduced over the replica's batch (tf.reduce_mean, batch statistics, local negatives), a
gradient used before the all-reduce (SAM's ε, clipping in the step), randomness keyed on the replica, BatchNorm
statistics of the replica's rows, random layers drawing from Keras' seed state. A FAIL names its cause: the
suspects the build shows (unsynchronized BatchNorm, unkeyed random layers) are turned off one at a time on both
sides, and the one whose absence makes them agree is named as confirmed; gradient clipping ops in the step are
named; inf or NaN on one side or both is named as such (no sum order makes a finite value infinite); else the step's
own reductions.
"""

import dataclasses
import re


import keras
import numpy as np
import tensorflow as tf

from loops import build as build_lib
from loops import check as check_lib
from loops.distribute import cluster
from loops.distribute import execution as execution_lib
from loops.distribute import strategy as strategy_lib
from loops.modeling import model as model_lib
from loops.modeling import optimizers as optimizers_lib
from loops.modeling import random_layers
from loops import private_apis

TOLERANCE = 1e-3  # largest relative difference of an update (float32 sums in another order stay below 1e-4)
# Under mixed precision a replica's partial sums are rounded to 16 bits before the all-reduce: measured on digits
# after 3 steps, up to 6e-2 (float16 with clipping) and 5e-2 (bfloat16); a cross-replica mistake gives 0.5-3.
PRECISION_TOLERANCE = {"float16": 0.25, "bfloat16": 0.25}
STEPS = 3
SIDES = {"replicas": ("1", "2 replicas"), "workers": ("1 device", "2 workers")}


def variant(config, replicas, steps):
  """The config on `replicas` replicas of this machine, deterministic, for `steps` steps, no tf.data service."""
  c = config.copy_and_resolve_references()
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


@dataclasses.dataclass(frozen=True)
class Suspects:
  """What in a build makes N replicas differ from one by construction (paths), and clipping ops in its step."""
  batchnorm: tuple = ()  # BatchNormalization layers of trained models, not synchronized: the replica's statistics
  random: tuple = ()  # layers drawing from Keras' seed state: one draw for every replica
  clipping: tuple = ()  # gradient clipping in the step (name scopes), before the optimizers' cross-replica sum


def trained_values(config, steps, role=None, strategy=None):
  """{key: (initial, final, path)} of every model and optimizer variable after `steps` steps. role: this process's
  cluster.ClusterRole (a worker of loops/worker_check.py), default local; strategy: as build_lib.build's."""
  return train(config, steps, role=role, strategy=strategy)[0]


def train(config, steps, turn_off=(), role=None, strategy=None):
  """(trained_values, Suspects) of this config; turn_off: suspects removed first ("batchnorm": synchronized,
  "random": in inference mode); strategy: as build_lib.build's (None: started for this config)."""
  check_lib.check(config)
  strategy_lib.configure_devices(config)
  parts = build_lib.build(config, role or cluster.ClusterRole(), strategy=strategy)
  _turn_off(parts, turn_off)
  variables = _named_variables(parts)
  initial = {key: v.numpy().copy() for key, v in variables.items()}
  execution = execution_lib.make(parts, config)
  execution.train(steps)
  suspects = Suspects(batchnorm=tuple(l.path for l in _unsynchronized_batchnorm(parts)),
                      random=tuple(l.path for m in parts.models.values() for l in random_layers.unkeyed(m)),
                      clipping=clipping_scopes(execution.train_graph_def(steps)))
  return {key: (initial[key], v.numpy(), f"{key[0]}: {v.path}") for key, v in variables.items()}, suspects


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
  build's paths differ: the order does not); trainable variables of models, then optimizer slots."""
  named = {}
  for name, model in parts.models.items():
    for i, variable in enumerate(model.variables):
      named[(f"model {name}", i)] = variable
  for name, optimizer in parts.optimizers.items():
    for i, variable in enumerate(optimizer.variables):
      if "iteration" not in variable.path:
        named[(f"optimizer {name}", i)] = variable
  return named


def relative_differences(one, two):
  """{path: max|Δ1 - Δ2| / max|Δ1|} for the updates Δ = final - initial (0 where neither run changed it)."""
  differences = {}
  for key, (initial, final_one, path) in one.items():
    initial_two, final_two, _ = two[key]
    if initial.shape != initial_two.shape or not np.array_equal(initial, initial_two):
      differences[path] = float("inf")  # not the same start: the check itself cannot compare
      continue
    update_one = final_one.astype(np.float64) - initial
    update_two = final_two.astype(np.float64) - initial
    scale = np.max(np.abs(update_one)) if update_one.size else 0.0
    gap = np.max(np.abs(update_one - update_two)) if update_one.size else 0.0
    differences[path] = 0.0 if gap == 0 else float(gap / scale) if scale else float("inf")
  return differences


def non_finite(one, two):
  """{path: "one", "two" or "both"}: the variables whose final values hold inf or NaN on that side."""
  sides = {}
  for key, (_, final_one, path) in one.items():
    if key in two:
      bad = (not np.all(np.isfinite(final_one)), not np.all(np.isfinite(two[key][1])))
      if any(bad):
        sides[path] = "both" if all(bad) else "one" if bad[0] else "two"
  return sides


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


def beyond_tolerance(differences, tolerance=TOLERANCE):
  return [path for path, value in differences.items() if not value <= tolerance]


def report(differences, steps, tolerance=TOLERANCE, shown=8, kind="replicas", cause=REDUCTION):
  """(passed, lines): the largest differences, the first beyond the tolerance, the verdict last (a FAIL with its
  cause). kind: "replicas" (1 vs 2 replicas of one process) or "workers" (one device vs 2 worker processes)."""
  one, two = SIDES[kind]
  ordered = sorted(differences.items(), key=lambda item: -item[1])
  lines = [f"largest relative differences of the updates after {steps} steps ({one} vs {two}):"]
  lines += [f"  {value:10.3e}  {path}" for path, value in ordered[:shown]]
  beyond = beyond_tolerance(differences, tolerance)
  if beyond:
    lines.append(f"first variable beyond the tolerance {tolerance:g}: {beyond[0]} ({differences[beyond[0]]:.3e})")
    lines.append(f"{kind}: FAIL: {len(beyond)} of {len(differences)} variables differ on {two} (largest "
                 f"{ordered[0][1]:.3e} in {ordered[0][0]}): {cause}")
    return False, lines
  largest = f"{ordered[0][1]:.3e} in {ordered[0][0]}" if ordered else "no variables"
  lines.append(f"{kind}: PASS: {one} and {two} agree on all {len(differences)} variables after {steps} steps "
               f"(largest relative difference {largest}; tolerance {tolerance:g})")
  return True, lines


def diagnose(suspects, agree_without=None):
  """The cause a FAIL names. agree_without(kind) -> True when both sides agree with that suspect turned off (None:
  no such rerun; the suspects are then named as likely)."""
  found = [kind for kind in ("batchnorm", "random") if getattr(suspects, kind)]
  for kind in found:
    if agree_without is not None and agree_without(kind):
      return f"cause: {_described(kind, suspects)} (confirmed: {TURNED_OFF[kind]}, the two agree); fix: {FIXES[kind]}"
  if suspects.clipping:
    return (f"likely cause: the step clips gradients before the cross-replica sum ({', '.join(suspects.clipping)}); "
            f"fix: {FIXES['clipping']}")
  if found and agree_without is None:
    return "likely cause: " + "; ".join(f"{_described(k, suspects)} (fix: {FIXES[k]})" for k in found)
  ruled_out = f" ({' and '.join(_described(k, suspects) for k in found)} ruled out: turned off, they still differ)"
  return REDUCTION + (ruled_out if found else "")


def _described(kind, suspects, shown=3):
  paths = getattr(suspects, kind)
  listed = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
  return f"{WHAT[kind]} ({listed})"


WHAT = {"batchnorm": "BatchNormalization with each replica's own batch statistics",
        "random": "random layers drawing the same values on every replica (Keras' seed state)"}
TURNED_OFF = {"batchnorm": "synchronized", "random": "in inference mode"}
FIXES = {
    "batchnorm": "--config.model.sync_batchnorm=True (every model of the task), or accept per-replica statistics",
    "random": ("Dropout, SpatialDropout, GaussianNoise, GaussianDropout and AlphaDropout draw per example; draw "
               "other noise in the step with ctx.normal or ctx.keyed_draws"),
    "clipping": ("clip with optimizer.global_clipnorm or ctx.optimizer(global_clipnorm=...), which clips the "
                 "gradient summed over replicas"),
}


def steps_for(config):
  """check.steps, or by default enough steps to reach every branch the task declares: at least STEPS, and the
  least common multiple of its Task.update_every periods (k=5: steps 0-4, the last one updating that model)."""
  if config.check.steps:
    return config.check.steps
  from loops import task as task_lib  # pylint: disable=import-outside-toplevel
  return max(STEPS, task_lib.update_span(config))


OTHER_STRATEGIES = {
    "multi_worker_mirrored": "; --check=workers runs it on 2 worker processes",
    "parameter_server": ("; parameter_server applies each worker's update on its own, so no run of it equals one "
                         "device: this proves the step, not the asynchrony"),
}


def tolerance_for(config):
  """TOLERANCE, or a mixed precision's (its rounding before the all-reduce)."""
  return PRECISION_TOLERANCE.get(config.mixed_precision, TOLERANCE)


def run(config, steps=None, tolerance=None, out=print):
  """Runs both and prints the report; returns True when they agree. steps: default steps_for(config);
  tolerance: default tolerance_for(config)."""
  steps = steps or steps_for(config)
  tolerance = tolerance or tolerance_for(config)
  if config.strategy not in ("one_device", "mirrored"):
    out(f"note: strategy={config.strategy}: this check runs the same step on one_device and on mirrored x2 in "
        f"this process{OTHER_STRATEGIES.get(config.strategy, '')}")
  strategy_lib.configure_devices(variant(config, 2, steps))  # both logical CPUs before TensorFlow starts
  with build_lib.determinism_restored():
    differences, suspects, sides = _compare(config, steps)
    cause = REDUCTION
    if beyond_tolerance(differences, tolerance):
      cause = non_finite_cause(sides) or diagnose(
          suspects, lambda kind: not beyond_tolerance(_compare(config, steps, (kind,))[0], tolerance))
  passed, lines = report(differences, steps, tolerance, cause=cause)
  for line in lines:
    out(line)
  return passed


def _compare(config, steps, turn_off=()):
  """(relative differences of 1 vs 2 replicas, the Suspects of the one-replica build, non_finite's sides)."""
  one, suspects = train(variant(config, 1, steps), steps, turn_off)
  two, _ = train(variant(config, 2, steps), steps, turn_off)
  return relative_differences(one, two), suspects, non_finite(one, two)
