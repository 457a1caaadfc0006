"""Where a 2-worker step's time goes: the same steps profiled on 1 worker and on 2, round by round.

  python -m benchmarks.anatomy --config=configs/cifar_resnet20.py:synthetic [--rounds=3] [--out=DIR]
      [--steps=40] [--steps_per_loop=4] [--profile_steps=16,36] [--override=KEY=VALUE ...]

Each round runs the config as 1 worker, then as 2 (order alternating by round), as the scaling study's
multi_worker case does: launch.local, one intra-op and one inter-op thread per worker, the config's global batch
per worker. A TensorBoard profiler trace of --profile_steps (rounded out to whole calls, after the warm-up) is
read on the chief:
  step           wall time from the first traced call's start to the last one's end, per step
  compute        time TensorFlow's compute threads spent running ops (ExecutorState::Process), per step
  idle_in_calls  time inside the calls when no op ran, per step: the all-reduce and waiting for the other worker
  between_calls  host time between the calls, per step: the read-out, the stop agreement, callbacks
Efficiency (step_1 / step_2: 2 workers do twice the images per step) splits into two factors:
  contention  compute_1 / compute_2: what running beside another worker costs the ops themselves (shared caches,
              memory bandwidth, the hypervisor): no code of the framework runs there
  framework   (compute_2 / step_2) / (compute_1 / step_1): the share of a step the framework's communication,
              waiting and host work take from the 2-worker run beyond the 1-worker one
Writes anatomy.json (every round and the medians) into --out.
"""

import glob
import json
import os
import statistics
import subprocess
import sys

from absl import app
from absl import flags

from benchmarks import study_config
from benchmarks import traces

_CONFIG = flags.DEFINE_string("config", None, "Config file, as for main.py (its batch = the per-worker batch).")
_OUT = flags.DEFINE_string("out", "runs/anatomy", "Output directory (must not hold an earlier run).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds of (1 worker, 2 workers), order alternating.")
_STEPS = flags.DEFINE_integer("steps", 40, "Steps per run.")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 4, "Steps per compiled call.")
_PROFILE = flags.DEFINE_list("profile_steps", ["16", "36"], "First and last traced step (whole calls).")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "Extra --config.KEY=VALUE overrides, e.g. key=value.")
flags.mark_flags_as_required(["config"])

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(workers, workdir, config, steps, steps_per_loop, profile, overrides):
  """The scaling study's multi_worker case (launch.local, 1 + 1 threads per worker) with a profiler window."""
  first, last = profile
  return [sys.executable, "-m", "launch.local", f"--workers={workers}", "--", sys.executable,
          os.path.join(REPO, "main.py"), f"--config={config}", f"--workdir={workdir}",
          "--config.strategy=multi_worker_mirrored", *[f"--config.{key}=1" for key in study_config.ONE_THREAD],
          f"--config.train.steps={steps}", f"--config.train.steps_per_loop={steps_per_loop}",  # steps before epochs
          *study_config.TRAINING_ONLY, f"--config.summary.profile_steps=({first},{last})",
          *[f"--config.{o}" for o in overrides]]


def run_round(round_, out, per_worker_batch, settings):
  """One round: 1 and 2 workers (2 first in odd rounds); returns {1: anatomy, 2: anatomy, split}."""
  result = {}
  for workers in ((1, 2) if round_ % 2 == 0 else (2, 1)):
    workdir = os.path.join(out, f"r{round_ + 1}-{workers}w")
    args = command(workers, workdir, settings["config"], settings["steps"], settings["steps_per_loop"],
                   settings["profile"], [f"train.global_batch_size={per_worker_batch * workers}",
                                         *settings["overrides"]])
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
      raise SystemExit(f"{' '.join(args)}\nfailed:\n{(done.stdout + done.stderr)[-3000:]}")
    result[workers] = traces.read(workdir, settings["steps_per_loop"])
  result["split"] = traces.efficiency_split(result[1], result[2])
  return result


def summarise(rounds):
  """Medians over the rounds: the efficiency and its two factors, each part of a step for 1 and 2 workers."""
  keys = ("efficiency", "contention", "framework")
  medians = {k: statistics.median(r["split"][k] for r in rounds) for k in keys}
  for workers in (1, 2):
    for part in ("step", "compute", "idle_in_calls", "between_calls"):
      medians[f"{part}_{workers}w"] = statistics.median(r[workers][part] for r in rounds)
  return medians


def report(rounds, medians):
  """The console summary: each round's split, the medians per step in milliseconds."""
  for i, r in enumerate(rounds):
    s = r["split"]
    print(f"[anatomy] round {i + 1}: efficiency {s['efficiency']:.3f} = contention {s['contention']:.3f} x "
          f"framework {s['framework']:.3f}")
  for workers in (1, 2):
    parts = ", ".join(f"{p} {medians[f'{p}_{workers}w'] * 1000:.1f} ms"
                      for p in ("step", "compute", "idle_in_calls", "between_calls"))
    print(f"[anatomy] {workers} worker(s), per step (medians): {parts}")
  print(f"[anatomy] medians: efficiency {medians['efficiency']:.3f}, contention {medians['contention']:.3f}, "
        f"framework {medians['framework']:.3f}")


def main(argv):
  del argv
  profile = tuple(int(v) for v in _PROFILE.value)
  if len(profile) != 2 or not 0 < profile[0] < profile[1] <= _STEPS.value or _ROUNDS.value < 1:
    raise app.UsageError("--profile_steps=FIRST,LAST with 0 < FIRST < LAST <= --steps, and --rounds >= 1")
  if _STEPS.value % _STEPS_PER_LOOP.value:
    raise app.UsageError(f"--steps must be a multiple of --steps_per_loop={_STEPS_PER_LOOP.value} (every traced "
                         f"call the same length)")
  out = os.path.abspath(_OUT.value)
  if os.path.exists(os.path.join(out, "anatomy.json")) or glob.glob(os.path.join(out, "r*-*w")):
    raise SystemExit(f"{out} holds an earlier run: give --out a new directory (results are never overwritten)")
  per_worker_batch = study_config.batch(study_config.load(_CONFIG.value))
  settings = {"config": _CONFIG.value, "steps": _STEPS.value, "steps_per_loop": _STEPS_PER_LOOP.value,
              "profile": profile, "overrides": _OVERRIDES.value}
  rounds = [run_round(i, out, per_worker_batch, settings) for i in range(_ROUNDS.value)]
  medians = summarise(rounds)
  with open(os.path.join(out, "anatomy.json"), "w") as f:
    json.dump({"medians": medians, "rounds": [{str(k): v for k, v in r.items()} for r in rounds],
               "per_worker_batch": per_worker_batch, **settings}, f, indent=2)
  report(rounds, medians)
  return 0


if __name__ == "__main__":
  app.run(main)
