"""The replica checks' verdict: what float rounding alone explains, measured on the same model, step and precision.

Every step k starts both sides from the same state s_k (the one-device side's) and compares their one-step updates
u = s_{k+1} - s_k, variable by variable, so a difference cannot grow from step to step (a float32 ResNet-20 with
synchronized BatchNorm otherwise amplifies rounding ~100x per step). What rounding explains is measured, not
assumed: the one-device side takes the same step once more with every weight moved by one rounding of the compute
precision (a change the mathematics is blind to); its update's distance from the first is the floor F. The sides
differ by D. D and F are RMS over the variable's elements divided by the larger of the variable's own update RMS
and its owner's (one model's, or one optimizer's, variables together): a variable whose true gradient is zero (a
conv bias before BatchNorm) moves by rounding only, and is judged against its owner's scale, not its own noise.

A variable differs at a step when D > MARGIN x max(F, its owner's F, MINIMUM). Where it does, the replica check
measures the two-replica side's own error F2 too (its step in float64) and the variable differs only when D also
exceeds BOTH_MARGIN x (F + F2), each the larger of its own and its owner's: one side's error cannot see what only
the other side rounds (a sum that is zero over the global batch only, such as the gradient of a BatchNormalization
beta before another synchronized BatchNorm, cancels two large per-replica partial sums on 2 replicas). Pure numpy:
no TensorFlow here.
"""

import dataclasses
import math

import numpy as np

# Measured on the shipped configs and example tasks (tests/test_check_table.py): with correct code D/F stayed below
# 6 at the default 3 steps (ResNet-20 with synchronized BatchNorm at step 1: 5.0 for one variable, under 3.5
# otherwise); every planted mistake of the replica matrix gives D/F above 100 where it starts. Longer checks of
# synchronized BatchNorm exceed it (ResNet-8 at step 6: BatchNorm betas 2.7e-3 apart where 10x the one-replica floor
# allowed 1e-4; ResNet-20 from step 241, D/F up to 33 at step 277) where the two-replica side rounds more than the
# one-replica side: hence BOTH_MARGIN.
MARGIN = 10.0
# When both sides' float64 steps agree, their float32 updates cannot differ by more than their own errors summed (the
# triangle inequality of the RMS): measured with correct code up to 0.9 of the sum (ResNet-20, step 97, the 12
# variables nearest it; their float64 steps 1e-14 apart); a real difference shows in the float64 steps as well.
BOTH_MARGIN = 2.0
# A relative difference no step is judged on, whatever the floor (the floor of a step that moves little).
MINIMUM = {None: 1e-5, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
# One rounding of the compute precision: the relative size of the floor run's move of every weight.
NUDGE = {None: 2.0**-23, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


@dataclasses.dataclass(frozen=True)
class Row:
  """One variable at one step: the sides' relative difference, and what rounding explains there."""
  step: int  # 1-based
  path: str
  difference: float
  explained: float

  @property
  def ratio(self):
    if self.explained:
      return self.difference / self.explained
    return math.inf if self.difference else 0.0  # sides equal where nothing is explained: agreement, not the worst

  @property
  def differs(self):
    return not self.difference <= self.explained  # NaN differs


def _rms(array):
  return float(np.sqrt(np.mean(np.square(array)))) if array.size else 0.0


def _owner_rms(arrays):
  """{owner: RMS over every element of its variables}."""
  sums, counts = {}, {}
  for (owner, _), array in arrays.items():
    sums[owner] = sums.get(owner, 0.0) + float(np.sum(np.square(array)))
    counts[owner] = counts.get(owner, 0) + array.size
  return {owner: math.sqrt(sums[owner] / counts[owner]) if counts[owner] else 0.0 for owner in sums}


def updates(start, final):
  """{key: final - start} in float64."""
  return {key: np.asarray(final[key], np.float64) - np.asarray(start[key], np.float64) for key in start}


def step_rows(step, one, two, floor, paths, minimum=MINIMUM[None], margin=MARGIN):
  """[Row] of every variable: one, two, floor are {key: update} of the one-device side, the other side and the floor
  run from the same start; paths {key: path}."""
  scale = _owner_rms(one)
  gaps = {key: one[key] - two[key] for key in one}
  floor_gaps = {key: one[key] - floor[key] for key in one}
  owner_floor = {owner: value / scale[owner] if scale[owner] else 0.0
                 for owner, value in _owner_rms(floor_gaps).items()}
  rows = []
  for key, update in one.items():
    own = max(_rms(update), scale[key[0]])
    gap, floor_gap = _rms(gaps[key]), _rms(floor_gaps[key])
    if own:
      difference, floor_value = gap / own, floor_gap / own
    else:  # neither this variable nor its owner moved on the one-device side
      difference, floor_value = (0.0 if gap == 0 else math.inf), 0.0
    explained = margin * max(floor_value, owner_floor[key[0]], minimum)
    rows.append(Row(step, paths[key], difference, explained))
  return rows


def summed(rows, others):
  """The rows of one step, each explaining its own and the other measure's together (same order)."""
  return [dataclasses.replace(row, explained=row.explained + other.explained) for row, other in zip(rows, others)]


@dataclasses.dataclass(frozen=True)
class Verdict:
  """Every step's rows; the first step where a variable differs, and the worst rows."""
  rows: tuple

  @property
  def passed(self):
    return not self.beyond

  @property
  def beyond(self):
    return [row for row in self.rows if row.differs]

  @property
  def first_step(self):
    """The first step where some variable differs (None: none does)."""
    return min((row.step for row in self.beyond), default=None)

  def worst(self, count=1, step=None):
    """The rows of the largest difference / explained (of `step` only, when given)."""
    rows = [row for row in self.rows if step is None or row.step == step]
    return sorted(rows, key=lambda row: -row.ratio if not math.isnan(row.ratio) else -math.inf)[:count]

  def variables_beyond(self, step):
    return [row for row in self.beyond if row.step == step]

  @property
  def variables(self):
    return len({row.path for row in self.rows})
