"""`main.py --check=replicas`: does this task and config compute on 2 replicas what it computes on 1?

Runs a few train steps from the same initial weights with op determinism on, once on one replica and once on two
(two GPUs when there are, else two logical CPUs), the same global batches, and compares every model and optimizer
variable by its path: the relative difference of the two runs' UPDATES (final - initial), so a wrong reduction
shows even when the weights barely moved. Prints the largest differences, the first variable beyond the tolerance,
and one last line with the verdict. Nothing is written.

What it catches: a loss reduced over the replica's batch (tf.reduce_mean, batch statistics, local negatives), a
gradient used before the all-reduce (SAM's ε), randomness keyed on the replica.
"""

import numpy as np
import tensorflow as tf

from loops import build as build_lib
from loops import check as check_lib
from loops.distribute import cluster
from loops.distribute import execution as execution_lib
from loops.distribute import strategy as strategy_lib

TOLERANCE = 1e-3  # largest relative difference of an update (float32 sums in another order stay below 1e-4)
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
  c.deterministic = True
  c.data.service = ""
  c.train.steps, c.train.epochs, c.train.steps_per_loop = steps, None, steps
  return c


def trained_values(config, steps):
  """{key: (initial, final, path)} of every model and optimizer variable after `steps` steps."""
  check_lib.check(config)
  strategy_lib.configure_devices(config)
  parts = build_lib.build(config, cluster.ClusterTask())
  variables = _named_variables(parts)
  initial = {key: v.numpy().copy() for key, v in variables.items()}
  execution_lib.make(parts, config).train(steps)
  return {key: (initial[key], v.numpy(), f"{key[0]}: {v.path}") for key, v in variables.items()}


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


def report(differences, steps, tolerance=TOLERANCE, shown=8, kind="replicas"):
  """(passed, lines): the largest differences, the first beyond the tolerance, the verdict last. kind: "replicas"
  (1 vs 2 replicas of one process) or "workers" (one device vs 2 worker processes)."""
  one, two = SIDES[kind]
  ordered = sorted(differences.items(), key=lambda item: -item[1])
  lines = [f"largest relative differences of the updates after {steps} steps ({one} vs {two}):"]
  lines += [f"  {value:10.3e}  {path}" for path, value in ordered[:shown]]
  beyond = [path for path, value in differences.items() if not value <= tolerance]
  if beyond:
    lines.append(f"first variable beyond the tolerance {tolerance:g}: {beyond[0]} ({differences[beyond[0]]:.3e})")
    lines.append(f"{kind}: FAIL: {len(beyond)} of {len(differences)} variables differ on {two} (largest "
                 f"{ordered[0][1]:.3e} in {ordered[0][0]}): the step reduces over the replica's own batch somewhere "
                 f"(see loops/task/context.py: ctx.average, ctx.all_gather, ctx.sum_over_replicas, ctx.normal)")
    return False, lines
  largest = f"{ordered[0][1]:.3e} in {ordered[0][0]}" if ordered else "no variables"
  lines.append(f"{kind}: PASS: {one} and {two} agree on all {len(differences)} variables after {steps} steps "
               f"(largest relative difference {largest}; tolerance {tolerance:g})")
  return True, lines


def steps_for(config):
  """check.steps, or by default enough steps to reach every branch the task declares (at least STEPS)."""
  return config.check.steps or STEPS


def run(config, steps=None, tolerance=TOLERANCE, out=print):
  """Runs both and prints the report; returns True when they agree. steps: default steps_for(config)."""
  steps = steps or steps_for(config)
  strategy_lib.configure_devices(variant(config, 2, steps))  # both logical CPUs before TensorFlow starts
  with build_lib.determinism_restored():
    one = trained_values(variant(config, 1, steps), steps)
    two = trained_values(variant(config, 2, steps), steps)
  passed, lines = report(relative_differences(one, two), steps, tolerance)
  for line in lines:
    out(line)
  return passed
