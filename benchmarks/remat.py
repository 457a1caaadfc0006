"""Rematerialization side by side: a train step's memory and time without and with each model.remat mode.

  python -m benchmarks.remat --config=configs/cifar_resnet20.py:synthetic [--modes=,blocks,full] [--rounds=2]
      [--steps=6] [--steps_per_loop=2] [--override=KEY=VALUE ...] [--out=results.json]

Each round runs main.py once per mode, in an order rotated every round (machine noise hits every mode alike), and
reads its summary.json: memory_mb.step_added_mb (the allocator's peak in a train call less what was in use when the
call began: a step's activations, gradients and temporaries), memory_mb.step_peak_mb, and examples_per_sec (the
calls after the first, tracing, one). Prints each mode's medians and its ratios to the first mode ("" = off).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags


_CONFIG = flags.DEFINE_string("config", "configs/cifar_resnet20.py:synthetic", "The config (as main.py's).")
_MODES = flags.DEFINE_list("modes", ["", "blocks", "full"], "model.remat modes; the first is the reference.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Rounds of every mode.")
_STEPS = flags.DEFINE_integer("steps", 6, "Train steps per run.")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 2, "Steps per call (the first call, tracing, is not timed).")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "KEY=VALUE: a --config.KEY=VALUE of every run.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
KEYS = ("memory_mb.step_added_mb", "memory_mb.step_peak_mb", "examples_per_sec")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(mode, workdir):
  """The summary.json of one main.py run with model.remat=mode."""
  done = subprocess.run(command(mode, workdir), cwd=REPO, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"model.remat={mode!r} failed:\n{(done.stdout + done.stderr)[-3000:]}")
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def lookup(results, dotted):
  for part in dotted.split("."):
    results = results[part]
  return float(results)


def command(mode, workdir):
  """main.py with the benchmark's settings and model.remat=mode."""
  return [sys.executable, "main.py", f"--config={_CONFIG.value}", f"--config.model.remat={mode}",
          f"--config.train.steps={_STEPS.value}", f"--config.train.steps_per_loop={_STEPS_PER_LOOP.value}",
          "--config.eval.every_steps=0", "--config.export=False",
          *[f"--config.{o}" for o in _OVERRIDES.value], f"--workdir={workdir}"]


def measure(modes, rounds, scratch):
  """{mode: {key: [value per round]}}."""
  values = {mode: {key: [] for key in KEYS} for mode in modes}
  for round_ in range(rounds):
    order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
    for mode in order:
      summary = run_once(mode, os.path.join(scratch, f"r{round_}_{mode or 'off'}"))
      for key in KEYS:
        values[mode][key].append(lookup(summary, key))
      print(f"[remat] round {round_ + 1} {mode or 'off'}: " +
            ", ".join(f"{k}={v[-1]:.4g}" for k, v in values[mode].items()), flush=True)
  return values


def report(values):
  """{mode: {key: median, key + '_ratio': median / the first mode's median}}."""
  reference = next(iter(values.values()))
  results = {}
  for mode, by_key in values.items():
    row = {}
    for key, series in by_key.items():
      median, base = statistics.median(series), statistics.median(reference[key])
      row[key] = median
      row[key + "_ratio"] = median / base if base else None
    results[mode or "off"] = row
  return results


def main(argv):
  del argv
  scratch = tempfile.mkdtemp(prefix="remat-")
  results = report(measure(list(_MODES.value), _ROUNDS.value, scratch))
  for mode, row in results.items():
    print(f"[remat] {mode}: step_added {row[KEYS[0]]:.1f} MB ({row[KEYS[0] + '_ratio']:.3f}x), step_peak "
          f"{row[KEYS[1]]:.1f} MB, {row[KEYS[2]]:.3g} examples/s (time per step {1 / row[KEYS[2] + '_ratio']:.3f}x)")
  document = {"config": _CONFIG.value, "overrides": _OVERRIDES.value, "steps": _STEPS.value, "results": results}
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(document, f, indent=1)
  print(json.dumps(document))
  return 0


if __name__ == "__main__":
  app.run(main)
