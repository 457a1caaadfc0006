"""The same budget of trials, searched four ways on digits with the learning rate over 1e-4..1: a log-spaced grid,
random draws, TPE, TPE + ASHA (each a real `python -m launch.sweep`, 2 trials at a time). Per search: the best
eval/accuracy found (the best eval of the best trial) and the train steps spent (from the trials' summary.json).

  python -m benchmarks.search [--trials=8] [--steps=400] [--seeds=0,1,2] [--out=DIR]

Random and TPE searches run once per seed; the grid once. Writes DIR/search.json and prints a table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOW, HIGH = 1e-4, 1.0


def sweep_args(search, trials, seed):
  """The sweep flags of one search."""
  key = "optimizer.learning_rate"
  if search == "grid":
    values = [f"{LOW * (HIGH / LOW) ** (i / (trials - 1)):.3g}" for i in range(trials)]
    return ["--grid", f"{key}={','.join(values)}"]
  space = ["--grid", f"{key}=loguniform:{LOW:g}:{HIGH:g}", "--trials", str(trials), "--seed", str(seed)]
  if search == "random":
    return [*space, "--search=random"]
  return [*space, "--search=tpe", "--prune=" + ("asha" if search == "tpe+asha" else "none")]


def run_search(search, trials, steps, seed, out):
  """One sweep; {'search', 'seed', 'best', 'steps', 'full_steps', 'pruned', 'seconds'}."""
  sweep_dir = os.path.join(out, f"{search}-{seed}")
  every = max(1, steps // 8)
  extra = ["--", f"--config.train.steps={steps}", f"--config.train.steps_per_loop={every}",
           f"--config.eval.every_steps={every}", f"--config.checkpoint.every_steps={steps}", "--config.export=False"]
  started = time.monotonic()
  done = subprocess.run([sys.executable, "-m", "launch.sweep", "--config=configs/digits_cnn.py",
                         f"--sweep_dir={sweep_dir}", *sweep_args(search, trials, seed), "--parallel", "2", *extra],
                        cwd=REPO, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"error: the {search} sweep failed ({done.returncode}): {done.stderr.strip()[-500:]}")
  summaries, bests = [], []
  for name in os.listdir(sweep_dir):
    path = os.path.join(sweep_dir, name, "summary.json")
    if os.path.exists(path):
      with open(path) as f:
        summaries.append(json.load(f))
      with open(os.path.join(sweep_dir, name, "best", "best.json")) as f:
        bests.append(json.load(f)["value"])
  return {"search": search, "seed": seed, "best": max(bests), "steps": sum(s["step"] for s in summaries),
          "full_steps": steps * len(summaries), "pruned": sum("pruned" in s for s in summaries),
          "seconds": round(time.monotonic() - started, 1)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--trials", type=int, default=8)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--searches", default="grid,random,tpe,tpe+asha")
  parser.add_argument("--out", default=None, help="directory for the sweeps and search.json (default: a temp dir)")
  args = parser.parse_args(argv)
  out = args.out or tempfile.mkdtemp(prefix="search-bench-")
  seeds = [int(s) for s in args.seeds.split(",")]
  results = []
  for seed in seeds:  # interleaved: each seed runs every search before the next seed
    for search in args.searches.split(","):
      if search == "grid" and seed != seeds[0]:
        continue
      results.append(run_search(search, args.trials, args.steps, seed, out))
      print(json.dumps(results[-1]), flush=True)
  table = summarize(results)
  with open(os.path.join(out, "search.json"), "w") as f:
    json.dump({"trials": args.trials, "steps": args.steps, "runs": results, "by_search": table}, f, indent=1)
  print(f"{'search':10} {'runs':>4} {'best (median, min-max)':>24} {'steps spent (median)':>22} {'of full':>8}")
  for search, row in table.items():
    print(f"{search:10} {row['runs']:>4} {row['best_median']:>10.4f} ({row['best_min']:.4f}-{row['best_max']:.4f}) "
          f"{row['steps_median']:>22.0f} {row['share_of_full']:>7.0%}")
  print(f"results: {os.path.join(out, 'search.json')}")


def summarize(results):
  """{search: runs, best median/min/max, steps median, share of the full-length budget}."""
  table = {}
  for search in dict.fromkeys(r["search"] for r in results):
    runs = [r for r in results if r["search"] == search]
    steps = statistics.median(r["steps"] for r in runs)
    table[search] = {"runs": len(runs), "best_median": statistics.median(r["best"] for r in runs),
                     "best_min": min(r["best"] for r in runs), "best_max": max(r["best"] for r in runs),
                     "steps_median": steps, "share_of_full": steps / runs[0]["full_steps"]}
  return table


if __name__ == "__main__":
  main()
