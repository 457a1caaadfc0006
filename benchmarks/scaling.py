"""The seeds' scaling study: epoch time, images/s and speedup for 1 vs 2 replicas and 1 vs 2 workers, repeated.

  python -m benchmarks.scaling --config=configs/digits_cnn.py [--out=DIR] [--epochs=6] [--repeats=3]
      [--setups=mirrored,multi_worker] [--batch=B] [--settle_seconds=3] [--override=KEY=VALUE ...]

Weak scaling, as the seeds ran it: the per-replica batch stays at the config's global batch (or --batch), so the
global batch (and the lr, with lr_scaling=linear_replicas) grows with the replicas. Cases, each its own `main.py`
process:
  mirrored      1 and 2 replicas (2 = two logical CPUs sharing this machine's cores: a correctness setup, not
                a speed one)
  multi_worker  1 and 2 workers started with launch.local, each limited to one intra-op and one inter-op thread
                (unless --override sets them), so 2 workers use the 2 cores and the ideal speedup is 2.
  independent   the ceiling for multi_worker on this machine: 1 = multi_worker's 1-worker case; 2 = two such
                runs at once, not connected (no all-reduce, no waiting for a peer). Its "epoch" is one epoch's
                examples done by the pair (each run's epoch time / 2), so its efficiency is what two workers keep of
                one worker's speed when they share the machine (memory bandwidth, caches, the other processes) and
                communication is free; multi_worker's efficiency / this one = the share the framework's
                communication leaves (`efficiency_2_workers_of_ceiling`: per round, the unconnected pair's epoch
                time / the connected pair's).
Every case runs --repeats times, one at a time, after --settle_seconds of quiet, in rounds: each round runs each
setup's 1 and 2 back to back, in the order 1, 2 in even rounds and 2, 1 in odd ones (so a steady drift of the
shared machine does not always favour the same side). The speedup of a round is the pair's ratio; the headline
speedup is the median of the pair ratios (the ratio of the medians is reported beside it).
Epoch times exclude the first timed epoch and any epoch overlapping the first (tracing) call, so each case runs
train.steps_per_loop = at most half an epoch (derived from the case's steps per epoch, read from `--dry_run`,
unless --override sets it); the dry runs also warm the machine up before the first timed case.
Writes scaling.json (speedup_2_workers, efficiency_2_workers = speedup / 2, speedup_2_mirrored_replicas: medians;
per case and setup median, min, max, quartiles and every repeat; every run's load average before/after and the
share of the CPU other processes used meanwhile), scaling.csv (the same per case, one row per statistic and per
repeat) and three plots with the spread, titled with the config, batch and machine: epoch_time.png,
images_per_sec.png, speedup.png (with the ideal line).
"""

import csv
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import study_config

_CONFIG = flags.DEFINE_string("config", None, "Config file, as for main.py (its batch = the per-replica batch).")
_OUT = flags.DEFINE_string("out", "runs/scaling", "Output directory (must not hold an earlier study).")
_EPOCHS = flags.DEFINE_float("epochs", 6.0, "Epochs per case (time per epoch excludes the first timed one).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs of every case, interleaved in rounds.")
_SETUPS = flags.DEFINE_list("setups", ["mirrored", "multi_worker"],
                            "Setups to run: mirrored, multi_worker, independent (the ceiling for multi_worker).")
_BATCH = flags.DEFINE_integer("batch", None, "Per-replica batch (default: the config's global batch).")
_SETTLE = flags.DEFINE_float("settle_seconds", 3.0, "Idle seconds before each case, to let the machine settle.")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "Extra --config.KEY=VALUE overrides, e.g. key=value.")
flags.mark_flags_as_required(["config"])

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = {"mirrored": "mirrored", "multi_worker": "multi_worker_mirrored", "independent": "multi_worker_mirrored"}
RESERVED = ("train.global_batch_size=", "train.epochs=", "strategy=", "cpu_replicas=")
STATISTICS = ("median", "min", "q1", "q3", "max")


def schedule(repeats, setups):
  """[(setup, replicas, repeat)] in run order: per round, each setup's pair back to back, 1-2 then 2-1 (ABBA)."""
  order = []
  for repeat in range(repeats):
    pair = (1, 2) if repeat % 2 == 0 else (2, 1)
    order += [(setup, replicas, repeat) for setup in setups for replicas in pair]
  return order


def spread(values):
  """Median, min, max and quartiles (inclusive: from 2 values up) of `values`, which are kept too."""
  values = list(values)
  q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
  return {"median": statistics.median(values), "min": min(values), "q1": q1, "q3": q3, "max": max(values),
          "values": values}


def machine_snapshot():
  """Time, 1-minute load average, the machine's busy CPU seconds (/proc/stat; None elsewhere), our children's."""
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return {"time": time.monotonic(), "load": os.getloadavg()[0], "busy_cpu_seconds": _busy_cpu_seconds(),
          "own_cpu_seconds": children.ru_utime + children.ru_stime}


def _busy_cpu_seconds():
  try:
    with open("/proc/stat") as f:
      user, nice, system, _, _, irq, softirq, steal = [int(v) for v in f.readline().split()[1:9]]
  except (OSError, ValueError):
    return None
  return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_load(before, after, cores):
  """How busy the machine was around a case: load averages and the share of all cores' time that processes
  other than the case's (other developers, the hypervisor's steal) used while it ran."""
  wall = after["time"] - before["time"]
  load = {"wall_seconds": wall, "load_before": before["load"], "load_after": after["load"], "other_cpu_share": None}
  if before["busy_cpu_seconds"] is not None and after["busy_cpu_seconds"] is not None and wall > 0:
    others = (after["busy_cpu_seconds"] - before["busy_cpu_seconds"] -
              (after["own_cpu_seconds"] - before["own_cpu_seconds"]))
    load["other_cpu_share"] = max(0.0, others / (wall * cores))
  return load


def measure(order, run_case, settle_seconds, sleep=time.sleep, snapshot=machine_snapshot, cores=None):
  """Runs the cases of `order` one at a time with run_case(setup, replicas, repeat) -> {epoch_seconds,
  images_per_sec, global_batch_size, ...}; returns one record per run with the machine's load around it."""
  runs = []
  for setup, replicas, repeat in order:
    sleep(settle_seconds)
    before = snapshot()
    result = run_case(setup, replicas, repeat)
    load = machine_load(before, snapshot(), cores or os.cpu_count())
    runs.append({"setup": setup, "replicas": replicas, "repeat": repeat, **result, **load})
    others = "" if load["other_cpu_share"] is None else f", others used {load['other_cpu_share']:.0%} of the CPU"
    print(f"[scaling] {setup} x{replicas} repeat {repeat + 1}: {result['epoch_seconds']:.3f} s/epoch, "
          f"{result['images_per_sec']:.0f} images/s (load {load['load_before']:.1f} -> {load['load_after']:.1f}"
          f"{others})", flush=True)
  return runs


def pair_speedups(runs, setup):
  """Speedup of 2 over 1 for `setup`: per round (the pair run back to back), their spread, the ratio of medians."""
  seconds = {(r["replicas"], r["repeat"]): r["epoch_seconds"] for r in runs if r["setup"] == setup}
  rates = {(r["replicas"], r["repeat"]): r["images_per_sec"] for r in runs if r["setup"] == setup}
  rounds = sorted(repeat for replicas, repeat in seconds if replicas == 1 and (2, repeat) in seconds)
  result = spread([seconds[(1, k)] / seconds[(2, k)] for k in rounds])
  result["ratio_of_medians"] = (statistics.median(seconds[(1, k)] for k in rounds) /
                                statistics.median(seconds[(2, k)] for k in rounds))
  result["median_from_images_per_sec"] = statistics.median(rates[(2, k)] / rates[(1, k)] for k in rounds)
  return result


def of_ceiling(runs):
  """Per round, epoch time of the 2 unconnected runs / of the 2 connected workers: what the workers' communication
  (all-reduce, waiting for each other) leaves of the ceiling. Both 1-worker cases run the same command, so this
  compares the two 2-process cases directly (run a minute apart) rather than two noisier pair ratios."""
  seconds = {(r["setup"], r["repeat"]): r["epoch_seconds"] for r in runs if r["replicas"] == 2}
  rounds = sorted(k for setup, k in seconds if setup == "multi_worker" and ("independent", k) in seconds)
  return spread(seconds[("independent", k)] / seconds[("multi_worker", k)] for k in rounds)


def summarise(runs):
  """Per case: the spread of epoch time and images/s; per setup: the paired speedup and efficiency (/ 2)."""
  setups = list(dict.fromkeys(r["setup"] for r in runs))
  cases = []
  for setup in setups:
    for replicas in (1, 2):
      mine = [r for r in runs if r["setup"] == setup and r["replicas"] == replicas]
      cases.append({"setup": setup, "replicas": replicas, "global_batch_size": mine[0]["global_batch_size"],
                    "epoch_seconds": spread(r["epoch_seconds"] for r in mine),
                    "images_per_sec": spread(r["images_per_sec"] for r in mine)})
  speedup = {setup: pair_speedups(runs, setup) for setup in setups}
  efficiency = {setup: spread(v / 2 for v in s["values"]) for setup, s in speedup.items()}
  results = {}
  if "multi_worker" in speedup:
    results["speedup_2_workers"] = speedup["multi_worker"]["median"]
    results["efficiency_2_workers"] = efficiency["multi_worker"]["median"]
  if "mirrored" in speedup:
    results["speedup_2_mirrored_replicas"] = speedup["mirrored"]["median"]
  if "independent" in speedup:
    results["efficiency_ceiling_2_workers"] = efficiency["independent"]["median"]
    if "multi_worker" in speedup:
      results["of_ceiling"] = of_ceiling(runs)
      results["efficiency_2_workers_of_ceiling"] = results["of_ceiling"]["median"]
  rows = [{"setup": c["setup"], "replicas": c["replicas"], "global_batch_size": c["global_batch_size"],
           "epoch_seconds": c["epoch_seconds"]["median"], "images_per_sec": c["images_per_sec"]["median"],
           "speedup": speedup[c["setup"]]["median"] if c["replicas"] == 2 else 1.0} for c in cases]
  return {**results, "headline": "medians of the per-round pair ratios (epoch time of 1 / of 2, run back to back)",
          "speedup": speedup, "efficiency": efficiency, "cases": cases, "rows": rows, "runs": runs}


def csv_rows(results):
  """One row per case and statistic (median, min, q1, q3, max), then one per repeat with its machine load."""
  rows = []
  for case in results["cases"]:
    setup, replicas = case["setup"], case["replicas"]
    speedup = results["speedup"][setup] if replicas == 2 else spread([1.0] * len(case["epoch_seconds"]["values"]))
    base = {"setup": setup, "replicas": replicas, "global_batch_size": case["global_batch_size"]}
    for statistic in STATISTICS:
      rows.append({**base, "statistic": statistic, "epoch_seconds": case["epoch_seconds"][statistic],
                   "images_per_sec": case["images_per_sec"][statistic], "speedup": speedup[statistic],
                   "efficiency": speedup[statistic] / replicas})
    runs = [r for r in results["runs"] if r["setup"] == setup and r["replicas"] == replicas]
    for run, ratio in zip(sorted(runs, key=lambda r: r["repeat"]), speedup["values"]):
      rows.append({**base, "statistic": f"repeat_{run['repeat'] + 1}", "epoch_seconds": run["epoch_seconds"],
                   "images_per_sec": run["images_per_sec"], "speedup": ratio, "efficiency": ratio / replicas,
                   **{k: run[k] for k in ("load_before", "load_after", "other_cpu_share")}})
  return rows


def write_csv(rows, path):
  fields = list(dict.fromkeys(key for row in rows for key in row))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)


PLOTS = (("epoch_seconds", "time per epoch (s)", "epoch_time.png"),
         ("images_per_sec", "images / s", "images_per_sec.png"),
         ("speedup", "speedup vs 1 (per round)", "speedup.png"))


def plot(results, out, title):
  """The three plots: per setup the medians joined, min-max whiskers, every repeat as a dot; returns
  {filename: title}."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  titles = {}
  setups = list(results["speedup"])
  for key, ylabel, filename in PLOTS:
    figure, ax = plt.subplots(figsize=(6, 4.2))
    for i, setup in enumerate(setups):
      shift = 0.04 * (2 * i - len(setups) + 1)  # side by side, so the whiskers do not hide each other
      points = _plot_points(results, setup, key)
      xs = [replicas + shift for replicas, _ in points]
      medians = [s["median"] for _, s in points]
      whiskers = [[s["median"] - s["min"] for _, s in points], [s["max"] - s["median"] for _, s in points]]
      line = ax.errorbar(xs, medians, yerr=whiskers, marker="o", capsize=4, label=f"{setup}: median, min-max")
      for x, (_, s) in zip(xs, points):
        ax.scatter([x + 0.02] * len(s["values"]), s["values"], s=14, alpha=0.5, color=line[0].get_color(),
                   zorder=3)  # beside the whisker, so a repeat at its end stays visible
    if key == "speedup":
      ax.plot([1, 2], [1, 2], "k--", label="ideal")
    ax.set(xlabel="replicas / workers (dots: each repeat)", ylabel=ylabel, xticks=[1, 2])
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=8)
    figure.tight_layout()
    figure.savefig(os.path.join(out, filename), dpi=100)
    titles[filename] = ax.get_title()
    plt.close(figure)
  return titles


def _plot_points(results, setup, key):
  if key == "speedup":
    rounds = len(results["speedup"][setup]["values"])
    return [(1, spread([1.0] * rounds)), (2, results["speedup"][setup])]
  return [(c["replicas"], c[key]) for c in results["cases"] if c["setup"] == setup]


def machine_description():
  """Cores, CPU model (/proc/cpuinfo, else platform), architecture, host and TensorFlow version."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = (re.findall(r"^model name\s*:\s*(.+)$", f.read(), re.M) or [cpu])[0]
  except OSError:
    pass
  from importlib import metadata
  try:
    tensorflow = metadata.version("tensorflow")
  except metadata.PackageNotFoundError:
    tensorflow = None
  return {"cores": os.cpu_count(), "cpu": cpu.strip(), "machine": platform.machine(), "node": platform.node(),
          "tensorflow": tensorflow}


class CaseRunner:
  """run(setup, replicas, repeat): one case to the end in fresh processes (main.py, or launch.local's workers)."""

  def __init__(self, config, out, epochs, overrides, batch):
    self.config, self.out, self.epochs, self.overrides, self.batch = config, out, epochs, overrides, batch
    self.steps_per_loop = {}
    self.env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}

  def common(self, replicas):
    return [f"--config={self.config}", f"--config.train.epochs={self.epochs}", *study_config.TRAINING_ONLY,
            f"--config.train.global_batch_size={self.batch * replicas}"]

  def prepare(self, replicas_counts):
    """At most half an epoch per call (and at most the config's own), so whole epochs are timed after tracing."""
    for replicas in replicas_counts:
      if self._overridden("train.steps_per_loop"):
        continue
      dry = subprocess.run([sys.executable, "main.py", *self.common(replicas), *self._overrides(),
                            "--config.strategy=one_device", f"--workdir={self.out}", "--dry_run"], cwd=REPO,
                           capture_output=True, text=True, env=self.env)  # steps per epoch: global batch and data
      if dry.returncode != 0:
        raise SystemExit(f"--dry_run of the case failed:\n{(dry.stdout + dry.stderr)[-3000:]}")
      steps_per_epoch = int(re.search(r"^  steps_per_epoch: (\d+)$", dry.stdout, re.M).group(1))
      configured = int(re.search(r"^  steps_per_loop: (\d+)$", dry.stdout, re.M).group(1))
      self.steps_per_loop[replicas] = max(1, min(configured, steps_per_epoch // 2))

  def command(self, setup, replicas, workdir):
    python = [sys.executable, os.path.join(REPO, "main.py"), *self.common(replicas), f"--workdir={workdir}",
              f"--config.strategy={STRATEGIES[setup]}"]
    if replicas in self.steps_per_loop:
      python.append(f"--config.train.steps_per_loop={self.steps_per_loop[replicas]}")
    if setup == "mirrored":
      return python + [f"--config.cpu_replicas={replicas if replicas > 1 else 0}", *self._overrides()]
    threads = [f"--config.{key}=1" for key in study_config.ONE_THREAD if not self._overridden(key)]
    return ([sys.executable, "-m", "launch.local", f"--workers={replicas}", "--"] + python + threads +
            self._overrides())

  def __call__(self, setup, replicas, repeat):
    workdir = self.workdir(setup, replicas, repeat)
    if setup == "independent" and replicas == 2:
      return self._independent_pair(workdir)
    command = self.command(setup, replicas, workdir)
    return self._finish(command, workdir, subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                                         env=self.env))

  def _independent_pair(self, workdir):
    """Two unconnected 1-worker runs at once; the pair's epoch = each run's epoch time / 2 (the time the pair
    takes for one epoch's examples), its images/s the sum."""
    workdirs = [os.path.join(workdir, name) for name in ("a", "b")]
    commands = [self.command("independent", 1, w) for w in workdirs]
    processes = [subprocess.Popen(c, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=self.env) for c in commands]
    finished = [subprocess.CompletedProcess(c, 0, p.communicate()[0], "") for c, p in zip(commands, processes)]
    for done, process in zip(finished, processes):
      done.returncode = process.returncode
    each = [self._finish(c, w, done) for c, w, done in zip(commands, workdirs, finished)]
    return {"global_batch_size": sum(e["global_batch_size"] for e in each),
            "images_per_sec": sum(e["images_per_sec"] for e in each),
            "epoch_seconds": statistics.mean(e["epoch_seconds"] for e in each) / 2,
            "epoch_seconds_each": [e["epoch_seconds_each"] for e in each], "command": each[0]["command"]}

  def _finish(self, command, workdir, result):
    if result.returncode != 0:
      raise SystemExit(f"{' '.join(command)}\nfailed:\n{(result.stdout + result.stderr)[-3000:]}")
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    if summary["mean_epoch_seconds_excluding_first"] is None:
      raise SystemExit(f"{workdir} timed fewer than 2 epochs (epochs overlapping the first, tracing call are not "
                       f"timed): raise --epochs or lower train.steps_per_loop with --override")
    each = re.findall(r"epoch (\d+) took ([\d.]+) s", result.stdout + result.stderr)  # the chief's log, 2 decimals
    return {"global_batch_size": summary["global_batch_size"], "images_per_sec": summary["examples_per_sec"],
            "epoch_seconds": summary["mean_epoch_seconds_excluding_first"],
            "epoch_seconds_each": {int(e): float(s) for e, s in each},
            "command": ["python" if arg == sys.executable else arg for arg in command]}

  def workdir(self, setup, replicas, repeat):
    return os.path.join(self.out, f"{setup}-{replicas}-r{repeat + 1}")

  def _overridden(self, key):
    return any(o.startswith(key + "=") for o in self.overrides)

  def _overrides(self):
    return [f"--config.{o}" for o in self.overrides]


def config_batch(config):
  """The config's global batch (the study's per-replica batch); rejects configs whose length is in steps."""
  loaded = study_config.load(config)
  if loaded.train.steps is not None:
    raise SystemExit(f"{config} sets train.steps; the scaling study needs a config whose length is in epochs")
  return study_config.batch(loaded)


def report(results):
  """The console summary: per case median [min-max], per setup the paired speedup and efficiency."""
  for case in results["cases"]:
    t, r = case["epoch_seconds"], case["images_per_sec"]
    print(f"[scaling] {case['setup']:>12} x{case['replicas']}: {t['median']:.3f} s/epoch [{t['min']:.3f}-"
          f"{t['max']:.3f}], {r['median']:.0f} images/s [{r['min']:.0f}-{r['max']:.0f}]")
  for setup, s in results["speedup"].items():
    e = results["efficiency"][setup]
    print(f"[scaling] {setup} 2 vs 1: speedup {s['median']:.3f} (median of {len(s['values'])} pairs "
          f"[{s['min']:.3f}-{s['max']:.3f}], ratio of medians {s['ratio_of_medians']:.3f}, by images/s "
          f"{s['median_from_images_per_sec']:.3f}), efficiency {e['median']:.3f} [{e['min']:.3f}-{e['max']:.3f}]")
  if "of_ceiling" in results:
    e = results["of_ceiling"]
    print(f"[scaling] multi_worker of the ceiling (2 unconnected runs' epoch time / 2 workers', per round): "
          f"{e['median']:.3f} [{e['min']:.3f}-{e['max']:.3f}]")
  shares = [r["other_cpu_share"] for r in results["runs"] if r["other_cpu_share"] is not None]
  if shares:
    print(f"[scaling] other processes used {min(shares):.0%}-{max(shares):.0%} of the CPU during the cases")


def main(argv):
  del argv
  unknown = set(_SETUPS.value) - set(STRATEGIES)
  if unknown or _REPEATS.value < 1:
    raise app.UsageError(f"--setups takes {', '.join(STRATEGIES)} (got {sorted(unknown)}); --repeats >= 1")
  if _EPOCHS.value < 3:
    raise app.UsageError("--epochs must be >= 3: the first epoch overlaps the tracing call and the first timed "
                         "epoch is discarded as warm-up, so fewer leave no epoch to time")
  if any(o.startswith(RESERVED) for o in _OVERRIDES.value):
    raise app.UsageError(f"the study sets {', '.join(RESERVED)}: use --batch (per replica) and --epochs")
  out = os.path.abspath(_OUT.value)
  batch = _BATCH.value or config_batch(_CONFIG.value)
  runner = CaseRunner(_CONFIG.value, out, _EPOCHS.value, _OVERRIDES.value, batch)
  order = schedule(_REPEATS.value, _SETUPS.value)
  taken = [runner.workdir(*case) for case in order if os.path.exists(runner.workdir(*case))]
  if taken or os.path.exists(os.path.join(out, "scaling.json")):
    raise SystemExit(f"{out} holds an earlier study: give --out a new directory (results are never overwritten)")
  os.makedirs(out, exist_ok=True)
  runner.prepare((1, 2))
  machine = machine_description()
  runs = measure(order, runner, _SETTLE.value, cores=machine["cores"])
  results = summarise(runs)
  results.update({"config": _CONFIG.value, "batch_per_replica": batch, "epochs": _EPOCHS.value,
                  "repeats": _REPEATS.value, "settle_seconds": _SETTLE.value, "overrides": _OVERRIDES.value,
                  "order": [f"{setup}-{replicas}" for setup, replicas, _ in order], "machine": machine})
  with open(os.path.join(out, "scaling.json"), "w") as f:
    json.dump(results, f, indent=2)
  write_csv(csv_rows(results), os.path.join(out, "scaling.csv"))
  title = (f"{_CONFIG.value}, batch {batch} per replica, {_EPOCHS.value:g} epochs x {_REPEATS.value} repeats"
           f"{''.join(' --' + o for o in _OVERRIDES.value)}\n{machine['cores']} cores, {machine['cpu']} "
           f"({machine['machine']}), TF {machine['tensorflow']}")
  plot(results, out, title)
  report(results)
  print(json.dumps({k: v for k, v in results.items() if k.startswith(("speedup_", "efficiency_"))}, indent=2))
  return 0


if __name__ == "__main__":
  app.run(main)
