"""The seeds' scaling study: epoch time, images/s and speedup for 1 vs 2 replicas and 1 vs 2 workers.

  python -m benchmarks.scaling --config=configs/digits_cnn.py [--out=DIR] [--epochs=4] [--override=KEY=VALUE ...]

Weak scaling, as the seeds ran it: the per-replica batch stays at the config's global batch, so the global batch
(and the lr, with lr_scaling=linear_replicas) grows with the replicas. Cases, each its own `main.py` process:
  mirrored      1 and 2 replicas (2 = two logical CPUs sharing this machine's cores: a correctness setup, not
                a speed one)
  multi_worker  1 and 2 workers started with launch.local, each limited to one intra-op thread, so 2 workers use
                the 2 cores and the ideal speedup is 2.
Epoch times exclude the first timed epoch and any epoch overlapping the first (tracing) call, so each case runs
train.steps_per_loop = at most half an epoch (derived from the case's steps per epoch, read from `--dry_run`,
unless --override sets it). Writes scaling.csv, scaling.json (speedup_2_workers, efficiency_2_workers =
speedup / 2, ...) and three plots, titled with the config, batch and machine: epoch_time.png,
images_per_sec.png, speedup.png (with the ideal line).
"""

import csv
import json
import os
import platform
import re
import subprocess
import sys

from absl import app
from absl import flags

_CONFIG = flags.DEFINE_string("config", None, "Config file, as for main.py (its batch = the per-replica batch).")
_OUT = flags.DEFINE_string("out", "runs/scaling", "Output directory.")
_EPOCHS = flags.DEFINE_float("epochs", 4.0, "Epochs per case (time per epoch excludes the first).")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "Extra --config.KEY=VALUE overrides, e.g. key=value.")
flags.mark_flags_as_required(["config"])

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_case(name, workdir, strategy, replicas):
  """Runs one case to the end in fresh processes; returns its summary.json."""
  from ml_collections import config_flags  # noqa: F401  (only to fail early if the venv is wrong)
  common = [f"--config={_CONFIG.value}", f"--workdir={workdir}", f"--config.strategy={strategy}",
            f"--config.train.epochs={_EPOCHS.value}", "--config.eval.every_steps=0",
            "--config.checkpoint.every_steps=0", "--config.export=False", "--config.summary.progress_bar=off",
            *[f"--config.{o}" for o in _OVERRIDES.value]]
  batch = _base_batch()
  common.append(f"--config.train.global_batch_size={batch * replicas}")
  python = [sys.executable, os.path.join(REPO, "main.py")]
  if not any(o.startswith("train.steps_per_loop=") for o in _OVERRIDES.value):
    common.append(f"--config.train.steps_per_loop={_steps_per_loop(python + common)}")
  if strategy == "mirrored":
    command = python + common + [f"--config.cpu_replicas={replicas if replicas > 1 else 0}"]
  else:
    command = ([sys.executable, "-m", "launch.local", f"--workers={replicas}", "--"] + python + common +
               ["--config.intra_op_threads=1", "--config.inter_op_threads=1"])
  print(f"[scaling] {name}: {' '.join(command[-8:])}", flush=True)
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  if result.returncode != 0:
    raise SystemExit(f"case {name} failed:\n{(result.stdout + result.stderr)[-3000:]}")
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def _steps_per_loop(command):
  """At most half an epoch per call (and at most the config's own), so whole epochs are timed after tracing."""
  dry = subprocess.run(command + ["--config.strategy=one_device", "--dry_run"], cwd=REPO, capture_output=True,
                       text=True)  # steps per epoch depend on the global batch and the data only
  if dry.returncode != 0:
    raise SystemExit(f"--dry_run of the case failed:\n{(dry.stdout + dry.stderr)[-3000:]}")
  steps_per_epoch = int(re.search(r"^  steps_per_epoch: (\d+)$", dry.stdout, re.M).group(1))
  configured = int(re.search(r"^  steps_per_loop: (\d+)$", dry.stdout, re.M).group(1))
  return max(1, min(configured, steps_per_epoch // 2))


def _base_batch():
  import importlib.util
  path, _, arg = _CONFIG.value.partition(":")
  spec = importlib.util.spec_from_file_location("scaling_config", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)
  spec.loader.exec_module(module)
  config = module.get_config(arg or None)
  if config.train.steps is not None:
    raise SystemExit(f"{_CONFIG.value} sets train.steps; the scaling study needs a config whose length is in epochs")
  return config.train.global_batch_size or config.train.per_replica_batch_size


def plot(rows, out, title):
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  for key, ylabel, filename in (("epoch_seconds", "time per epoch (s)", "epoch_time.png"),
                                ("images_per_sec", "images / s", "images_per_sec.png"),
                                ("speedup", "speedup vs 1", "speedup.png")):
    figure, ax = plt.subplots(figsize=(5, 3.5))
    for setup in ("mirrored", "multi_worker"):
      points = [(r["replicas"], r[key]) for r in rows if r["setup"] == setup]
      ax.plot(*zip(*points), marker="o", label=setup)
    if key == "speedup":
      ax.plot([1, 2], [1, 2], "k--", label="ideal")
    ax.set_xlabel("replicas / workers")
    ax.set_ylabel(ylabel)
    ax.set_xticks([1, 2])
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=8)
    figure.tight_layout()
    figure.savefig(os.path.join(out, filename), dpi=100)
    plt.close(figure)


def main(argv):
  del argv
  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  rows = []
  for setup, strategy in (("mirrored", "mirrored"), ("multi_worker", "multi_worker_mirrored")):
    base = None
    for replicas in (1, 2):
      name = f"{setup}-{replicas}"
      workdir = os.path.join(out, name)
      if os.path.exists(workdir):
        raise SystemExit(f"{workdir} exists: give --out a new directory (results are never overwritten)")
      summary = run_case(name, workdir, strategy, replicas)
      epoch = summary["mean_epoch_seconds_excluding_first"]
      if epoch is None:
        raise SystemExit(f"case {name} timed fewer than 2 epochs (epochs overlapping the first, tracing call are "
                         f"not timed): raise --epochs or lower train.steps_per_loop with --override")
      base = base or epoch
      rows.append({"setup": setup, "replicas": replicas, "global_batch_size": summary["global_batch_size"],
                   "epoch_seconds": epoch, "images_per_sec": summary["examples_per_sec"], "speedup": base / epoch})
      print(f"[scaling] {name}: {epoch:.3f} s/epoch, {summary['examples_per_sec']:.0f} images/s", flush=True)
  with open(os.path.join(out, "scaling.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  by = {(r["setup"], r["replicas"]): r for r in rows}
  results = {
      "speedup_2_workers": by[("multi_worker", 2)]["speedup"],
      "efficiency_2_workers": by[("multi_worker", 2)]["speedup"] / 2,
      "speedup_2_mirrored_replicas": by[("mirrored", 2)]["speedup"],
      "rows": rows,
      "config": _CONFIG.value,
      "epochs": _EPOCHS.value,
  }
  with open(os.path.join(out, "scaling.json"), "w") as f:
    json.dump(results, f, indent=2)
  machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.node()}"
  plot(rows, out, f"{_CONFIG.value}, batch {_base_batch()} per replica\n{machine}")
  print(json.dumps({k: v for k, v in results.items() if k != "rows"}, indent=2))
  return 0


if __name__ == "__main__":
  app.run(main)
