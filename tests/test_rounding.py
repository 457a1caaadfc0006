"""The replica checks' verdict arithmetic (loops/rounding.py), without TensorFlow: differences judged against the
measured floor and the owner's scale, not a fixed tolerance per variable."""

import math

import numpy as np

from loops import rounding

PATHS = {("model m", 0): "model m: kernel", ("model m", 1): "model m: bias", ("optimizer m", 0): "optimizer m: slot"}


def updates(kernel, bias, slot):
  return {("model m", 0): np.asarray(kernel, np.float64), ("model m", 1): np.asarray(bias, np.float64),
          ("optimizer m", 0): np.asarray(slot, np.float64)}


def rows_by_path(one, two, floor, minimum=1e-6):
  return {row.path: row for row in rounding.step_rows(1, one, two, floor, PATHS, minimum)}


def test_a_variable_that_moves_by_rounding_only_is_judged_against_its_owner_not_its_own_noise():
  """A conv bias before BatchNorm: its true gradient is zero; the sides' rounding moves it in other directions."""
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 3, 8)) * 1e-2
  one = updates(kernel, [3e-9, -2e-9], [1.0])
  two = updates(kernel * (1 + 1e-7), [-4e-9, 5e-9], [1.0])  # the bias: every element's sign differs
  floor = updates(kernel * (1 - 1e-7), [1e-9, 1e-9], [1.0])
  rows = rows_by_path(one, two, floor)
  bias = rows["model m: bias"]
  assert not bias.differs and bias.difference < 1e-6, bias
  own_relative = np.max(np.abs(np.array([3e-9, -2e-9]) - [-4e-9, 5e-9])) / 3e-9  # the old per-variable measure
  assert own_relative > 1  # what the old check called a difference


def test_a_doubled_update_differs_and_a_floor_of_its_size_explains_a_difference_of_its_size():
  one = updates([1.0, -2.0, 0.5], [0.1, 0.2], [1.0, 1.0])
  rows = rows_by_path(one, updates([2.0, -4.0, 1.0], [0.2, 0.4], [2.0, 2.0]), one)
  assert all(row.differs for row in rows.values()) and rows["model m: kernel"].difference > 0.5
  noisy_floor = updates([1.05, -2.0, 0.5], [0.1, 0.2], [1.0, 1.0])
  noisy_two = updates([1.0, -2.1, 0.5], [0.1, 0.2], [1.0, 1.0])
  row = rows_by_path(one, noisy_two, noisy_floor)["model m: kernel"]
  assert not row.differs
  over_floor = row.difference / (row.explained / rounding.MARGIN)
  assert over_floor > 1.5 and over_floor < 2.5  # the sides' 0.1 against the floor's 0.05


def test_the_minimum_holds_where_the_floor_run_moved_nothing():
  one = updates([1.0, 2.0], [1.0], [1.0])
  row = rows_by_path(one, updates([1.0, 2.0 + 1e-7], [1.0], [1.0]), one, minimum=1e-6)["model m: kernel"]
  assert row.explained == rounding.MARGIN * 1e-6 and not row.differs


def test_nan_differs_and_a_variable_no_side_moves_is_equal():
  one = updates([1.0], [0.0], [0.0])
  rows = rows_by_path(one, updates([math.nan], [0.0], [0.0]), one)
  assert rows["model m: kernel"].differs
  assert rows["optimizer m: slot"].difference == 0.0 and not rows["optimizer m: slot"].differs
  moved = rows_by_path(one, updates([1.0], [0.0], [1.0]), one)["optimizer m: slot"]
  assert moved.difference == math.inf and moved.differs  # one side moved what the other did not move at all


def test_the_verdict_names_the_first_step_and_its_worst_variable():
  ok = [rounding.Row(1, "a", 1e-7, 1e-5), rounding.Row(2, "a", 2e-6, 1e-5)]
  bad = [rounding.Row(3, "b", 0.5, 1e-5), rounding.Row(3, "a", 0.9, 1e-5), rounding.Row(4, "a", 0.95, 1e-5)]
  verdict = rounding.Verdict(tuple(ok + bad))
  assert not verdict.passed and verdict.first_step == 3 and verdict.variables == 2
  assert [row.path for row in verdict.variables_beyond(3)] == ["b", "a"]
  assert verdict.worst(1, 3)[0].difference == 0.9 and verdict.worst(1)[0].step == 4
  assert rounding.Verdict(tuple(ok)).passed and rounding.Verdict(tuple(ok)).first_step is None
  # a variable equal on both sides where rounding explains nothing (the least difference forced to 0) is not the
  # worst row: the closest one is
  exact = rounding.Verdict((rounding.Row(1, "frozen", 0.0, 0.0), *ok))
  assert exact.passed and [(row.path, row.step) for row in exact.worst(1)] == [("a", 2)]
  assert rounding.Row(1, "moved", 1e-9, 0.0).ratio == math.inf
