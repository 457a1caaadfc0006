"""A profiler trace's train calls read as time per step: compute, idle inside the calls, host time between them
(flag-free, for benchmarks.anatomy and its tests)."""

import glob
import os

TRAIN_CALL = "train_fn"  # the compiled train call's name in the trace (loops/distribute/steps.py)
OP_RUN = "ExecutorState::Process"  # a compute thread running ops
COMPUTE_THREADS = "tf_Compute"


def call_and_op_intervals(xspace):
  """([(start, end)] of the train calls, [(start, end)] of the compute threads' op runs), in seconds, from a
  profiler XSpace (tensorflow.tsl.profiler.protobuf.xplane_pb2)."""
  calls, ops = [], []
  for plane in xspace.planes:
    names = {key: metadata.name for key, metadata in plane.event_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        name = names.get(event.metadata_id)
        start = line.timestamp_ns * 1e-9 + event.offset_ps * 1e-12
        interval = (start, start + event.duration_ps * 1e-12)
        if name == TRAIN_CALL:
          calls.append(interval)
        elif name == OP_RUN and line.name.startswith(COMPUTE_THREADS):
          ops.append(interval)
  return sorted(calls), sorted(ops)


def step_anatomy(calls, ops, steps_per_call):
  """Seconds per step: step (first call's start to last call's end), compute (op runs inside the calls),
  idle_in_calls (the rest of the calls: collectives, waiting for a peer) and between_calls (the host between
  them). Every call runs steps_per_call steps."""
  if not calls:
    raise ValueError(f"the trace holds no '{TRAIN_CALL}' call: is --profile_steps inside the run?")
  steps = len(calls) * steps_per_call
  in_calls = sum(b - a for a, b in calls)
  compute = sum(max(0.0, min(b, call_end) - max(a, call_start)) for a, b in ops for call_start, call_end in calls)
  wall = calls[-1][1] - calls[0][0]
  return {"step": wall / steps, "compute": compute / steps, "idle_in_calls": (in_calls - compute) / steps,
          "between_calls": (wall - in_calls) / steps, "calls": len(calls)}


def efficiency_split(one, two):
  """{efficiency, contention, framework} from the 1- and 2-worker anatomies (efficiency = their product)."""
  contention = one["compute"] / two["compute"]
  framework = (two["compute"] / two["step"]) / (one["compute"] / one["step"])
  return {"efficiency": one["step"] / two["step"], "contention": contention, "framework": framework}


def read(workdir, steps_per_call):
  """step_anatomy of the one profiler trace a run wrote under workdir/profile."""
  paths = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*.xplane.pb"))
  if len(paths) != 1:
    raise SystemExit(f"expected one profiler trace under {workdir}/profile, found {len(paths)}")
  from loops import private_apis  # pylint: disable=import-outside-toplevel  (TensorFlow only when reading)
  xspace = private_apis.profiler_xspace()
  with open(paths[0], "rb") as f:
    xspace.ParseFromString(f.read())
  return step_anatomy(*call_and_op_intervals(xspace), steps_per_call)
