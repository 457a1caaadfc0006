"""Where the sides part (loops/first_difference.py), from recorded values: rows put back in one device's order, a
replica's share of a scalar summed, and the first layer (else the loss, else the gradients) beyond its floor. The
recording inside real steps is proven by the located FAILs of tests/test_replica_invariance.py and test_tasks.py."""

import keras
import numpy as np

from loops import first_difference

LOSS = first_difference.LOSS


def recorder(values, layers=None):
  """A Recorder holding {name: value} for one replica (rows 0..n-1), in that order."""
  r = first_difference.Recorder()
  for name, value in values.items():
    value = np.asarray(value, np.float32)
    r.values[(name, 0, 0, 0)] = (np.arange(len(value)) if value.ndim else np.array([0]), value)
    r.order.append(name)
    r.layers[name] = (layers or {}).get(name)
    r.shown[name] = f"path of {name}"
  return r


def test_rows_come_back_in_one_devices_order_and_a_replicas_share_of_a_scalar_is_summed():
  r = first_difference.Recorder()
  r.values[("m:1", 0, 1, 0)] = (np.array([1, 3]), np.array([[2.0], [4.0]], np.float32))  # replica 1: strided rows
  r.values[("m:1", 0, 0, 0)] = (np.array([0, 2]), np.array([[1.0], [3.0]], np.float32))
  r.values[("m:1", 1, 0, 0)] = (np.array([0]), np.array([9.0], np.float32))  # a second output of the layer
  r.values[(first_difference.STEP_LOSS, 0, 0, 0)] = (np.array([0]), np.float32(1.5))
  r.values[(first_difference.STEP_LOSS, 0, 1, 0)] = (np.array([1]), np.float32(2.5))
  assert r.assembled("m:1").tolist() == [1.0, 2.0, 3.0, 4.0, 9.0]
  assert r.assembled(first_difference.STEP_LOSS).tolist() == [4.0]
  assert r.assembled("missing") is None


def test_a_layer_run_once_per_micro_batch_comes_back_whole_and_one_called_per_micro_batch_holds_its_rows():
  """Gradient accumulation: a layer traced once runs once per micro-batch (each micro-batch's rows kept), and a
  layer traced once per micro-batch ('#2': the second) holds that micro-batch's rows only (it raised IndexError,
  so a FAIL under train.grad_accum_steps ended in a traceback instead of its cause)."""
  r = first_difference.Recorder()
  for replica in (0, 1):
    for micro in (0, 1):  # replica r's micro-batch i: rows ((r * 2 + j) * 2 + i) of one device's batch of 8
      rows = (replica * 2 + np.arange(2)) * 2 + micro
      r.values[("m:1", 0, replica, micro)] = (rows, rows.astype(np.float32)[:, None])
      if micro == 1:
        r.values[("m:1#2", 0, replica, 0)] = (rows, rows.astype(np.float32)[:, None])
  assert r.assembled("m:1").tolist() == list(range(8))
  assert r.assembled("m:1#2").tolist() == [1.0, 3.0, 5.0, 7.0]


def test_the_first_layer_beyond_its_floor_is_named_with_what_it_is_else_the_loss_else_the_gradients():
  layers = {"m:1": keras.layers.Dense(2), "m:2": keras.layers.BatchNormalization()}
  one = recorder({"m:1": [1.0, 2.0], "m:2": [1.0, -1.0], "m:3": [5.0, 5.0], LOSS: [0.5, 0.25]}, layers)
  floor = recorder({"m:1": [1.0, 2.0], "m:2": [1.0, -1.0], "m:3": [5.0, 5.0], LOSS: [0.5, 0.25]}, layers)
  apart_at_bn = recorder({"m:1": [1.0, 2.0 + 1e-7], "m:2": [0.5, -1.5], "m:3": [4.0, 6.0], LOSS: [0.7, 0.1]})
  finding = first_difference.first(one, apart_at_bn, floor, minimum=1e-5)
  assert (finding.kind, finding.where, finding.place) == ("batchnorm", "path of m:2", "m:2")
  assert finding.difference > finding.explained == first_difference.rounding.MARGIN * 1e-5
  wide_floor = recorder({"m:1": [1.0, 2.0], "m:2": [0.4, -1.6], "m:3": [4.0, 6.0], LOSS: [0.5, 0.25]})
  assert first_difference.first(one, apart_at_bn, wide_floor, minimum=1e-5).kind == "loss"  # rounding explains them
  loss_only = recorder({"m:1": [1.0, 2.0], "m:2": [1.0, -1.0], "m:3": [5.0, 5.0], LOSS: [0.5, 0.5]})
  assert first_difference.first(one, loss_only, floor, minimum=1e-5).kind == "loss"
  assert first_difference.first(one, one, floor, minimum=1e-5).kind == "gradients"


def test_what_a_fail_says_for_each_finding():
  Finding = first_difference.Finding
  assert first_difference.described(Finding("batchnorm", "bn"), None, None, None, 3) == (
      "the sides part first at bn at step 3: BatchNormalization normalizing with each replica's own batch statistics "
      "(a difference by design, not a bug)")
  assert first_difference.described(Finding("random", "m/sampling"), None, None, None, 1).startswith(
      "the sides part first at m/sampling at step 1: it draws random values that are not keyed per example")
  exact = first_difference.described(Finding("gradients", ""), None, None, None, 2)
  assert exact.startswith("every layer's output and the loss agree at step 2; the gradients differ: ")
  assert "float64" not in exact
  assert first_difference.described(Finding("gradients", ""), None, None, None, 2, nudged=True) == exact + (
      ", or it is rounding of the gradients' sums that the nudged floor does not measure (the step does not run in "
      "float64, where the floor is exact)")


def test_rows_of_concatenated_views_are_matched_one_to_one_to_the_other_sides():
  """A model called on views of two streams concatenated (FixMatch): its rows are no one batch's, so 2 replicas'
  rows are matched to one device's, and a difference in any row still shows."""
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(6, 3)).astype(np.float32)
  one, two = first_difference.Recorder(), first_difference.Recorder()
  one.values[("m:1", 0, 0, 0)] = (np.array([0]), rows)
  two.values[("m:1", 0, 0, 0)] = (np.array([0]), rows[[4, 0, 2]])
  two.values[("m:1", 0, 1, 0)] = (np.array([1]), rows[[5, 1, 3]])
  for r in (one, two):
    r.unordered.add("m:1:0")
  assert np.array_equal(two.assembled("m:1", like=one), rows.ravel())
  two.values[("m:1", 0, 1, 0)] = (np.array([1]), rows[[5, 1, 3]] + np.float32(1e-3) * np.eye(3, dtype=np.float32)[1])
  assert np.abs(two.assembled("m:1", like=one) - rows.ravel()).max() > 9e-4
  too_many = np.zeros((int(np.sqrt(first_difference.MATCHED)) + 1, 1), np.float32)
  assert first_difference.matched(too_many, too_many) is None  # not judged rather than judged out of order
