"""benchmarks.traces (the arithmetic of benchmarks.anatomy) on hand-made traces, and one tiny anatomy run."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import traces
from tests.conftest import REPO


def xspace(calls, ops, other_thread_ops=()):
  """An XSpace as the profiler writes it: train_fn events on the main thread, op runs on a tf_Compute thread (and
  optionally on another thread, which must not count); intervals in seconds from the line's timestamp."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name="/host:CPU")
  for key, name in ((1, traces.TRAIN_CALL), (2, traces.OP_RUN), (3, "EagerExecute")):
    plane.event_metadata[key].name = name
    plane.event_metadata[key].id = key
  for thread, intervals, key in (("main.py", calls, 1), ("tf_Compute/123", ops, 2),
                                 ("tf_data_private_threadpool", other_thread_ops, 2)):
    line = plane.lines.add(name=thread, timestamp_ns=5_000_000_000)
    for start, end in intervals:
      line.events.add(metadata_id=key, offset_ps=int(start * 1e12), duration_ps=int((end - start) * 1e12))
  return space


def test_calls_and_op_runs_are_read_from_their_threads_in_seconds():
  space = xspace(calls=[(0.0, 1.0), (1.5, 2.5)], ops=[(0.1, 0.9)], other_thread_ops=[(0.2, 0.3)])
  calls, ops = traces.call_and_op_intervals(space)
  assert calls == [pytest.approx((5.0, 6.0)), pytest.approx((6.5, 7.5))]
  assert ops == [pytest.approx((5.1, 5.9))]


def test_a_step_splits_into_compute_idle_in_calls_and_host_between_calls():
  # Two calls of 4 steps: 1.0 s and 1.0 s, 0.5 s apart; ops run 1.6 s inside them and 0.2 s between them.
  calls, ops = [(0.0, 1.0), (1.5, 2.5)], [(0.0, 0.8), (1.1, 1.3), (1.5, 2.3)]
  anatomy = traces.step_anatomy(calls, ops, steps_per_call=4)
  assert anatomy["calls"] == 2
  assert anatomy["step"] == pytest.approx(2.5 / 8)
  assert anatomy["compute"] == pytest.approx(1.6 / 8)  # the op between the calls is host work, not a step's
  assert anatomy["idle_in_calls"] == pytest.approx(0.4 / 8)
  assert anatomy["between_calls"] == pytest.approx(0.5 / 8)
  assert anatomy["compute"] + anatomy["idle_in_calls"] + anatomy["between_calls"] == pytest.approx(anatomy["step"])


def test_efficiency_is_contention_times_the_framework_share():
  one = {"step": 0.34, "compute": 0.336}
  two = {"step": 0.38, "compute": 0.352}
  split = traces.efficiency_split(one, two)
  assert split["efficiency"] == pytest.approx(0.34 / 0.38)
  assert split["contention"] == pytest.approx(0.336 / 0.352)
  assert split["framework"] == pytest.approx((0.352 / 0.38) / (0.336 / 0.34))
  assert split["contention"] * split["framework"] == pytest.approx(split["efficiency"])


def test_a_trace_without_train_calls_is_an_error_naming_them():
  with pytest.raises(ValueError, match="no 'train_fn' call"):
    traces.step_anatomy([], [(0.0, 1.0)], steps_per_call=4)


@pytest.mark.e2e
def test_anatomy_run_profiles_one_and_two_workers(tmp_path):
  out = tmp_path / "anatomy"
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.anatomy", "--config=configs/digits_cnn.py", f"--out={out}", "--rounds=1",
       "--steps=24", "--steps_per_loop=4", "--profile_steps=8,16"], cwd=REPO, capture_output=True, text=True,
      timeout=600, env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  report = json.load(open(out / "anatomy.json"))
  (round_,) = report["rounds"]
  for workers in ("1", "2"):
    anatomy = round_[workers]
    assert anatomy["calls"] >= 2 and anatomy["compute"] > 0 and anatomy["between_calls"] >= 0
    parts = anatomy["compute"] + anatomy["idle_in_calls"] + anatomy["between_calls"]
    assert parts == pytest.approx(anatomy["step"], rel=1e-6)
  split = round_["split"]
  assert split["contention"] * split["framework"] == pytest.approx(split["efficiency"], rel=1e-9)
  assert report["medians"]["efficiency"] == pytest.approx(split["efficiency"])
  assert "[anatomy] medians: efficiency" in result.stdout


def test_anatomy_rejects_calls_of_unequal_length_before_running(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.anatomy", "--config=configs/digits_cnn.py", f"--out={tmp_path}",
       "--steps=30", "--steps_per_loop=4", "--profile_steps=8,16"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0 and "--steps must be a multiple of --steps_per_loop=4" in result.stderr
  assert not os.listdir(tmp_path)
