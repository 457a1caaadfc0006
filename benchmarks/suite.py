"""The suite's cost, file by file: each given test file run alone (`pytest -q -n 0 FILE`), its wall and CPU seconds
(pytest and every process it waited for) into one JSON. With benchmarks.ab it compares two commits side by side:

  python -m benchmarks.ab --base=REV --key=total.cpu --key=total.wall --rounds=2 -- \\
      python {head}/benchmarks/suite.py --out={out} tests/test_tasks.py tests/test_sweep.py

({head} is this checkout, so the base commit is measured by the same script; each side runs its own tests.) Output:
{"files": {FILE: {"wall": s, "cpu": s}}, "total": {"wall": s, "cpu": s}}. A file that fails stops the run: a cut
is measured on a suite that passes. Imports nothing of the project (it runs on other commits' trees).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def children_cpu():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def measure(path):
  """{"wall", "cpu"} of one test file run alone in this directory; SystemExit with its tail when it fails."""
  cpu, wall = children_cpu(), time.monotonic()
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", path],
                        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  seconds = {"wall": round(time.monotonic() - wall, 2), "cpu": round(children_cpu() - cpu, 2)}
  if done.returncode != 0:
    raise SystemExit(f"{path} failed in {os.getcwd()}:\n{(done.stdout + done.stderr)[-3000:]}")
  return seconds


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="the JSON file to write")
  parser.add_argument("files", nargs="+", help="test files, relative to this directory")
  args = parser.parse_args(argv)
  missing = [path for path in args.files if not os.path.isfile(path)]
  if missing:
    raise SystemExit(f"no such test file in {os.getcwd()}: {', '.join(missing)}")
  files = {}
  for path in args.files:
    files[path] = measure(path)
    print(f"[suite] {path}: {files[path]['wall']:.1f} s wall, {files[path]['cpu']:.1f} s CPU", flush=True)
  total = {key: round(sum(f[key] for f in files.values()), 2) for key in ("wall", "cpu")}
  with open(args.out, "w") as f:
    json.dump({"files": files, "total": total}, f, indent=1)
  print(f"[suite] total: {total['wall']:.1f} s wall, {total['cpu']:.1f} s CPU")


if __name__ == "__main__":
  main()
