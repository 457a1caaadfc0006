"""A/B: one command run alternately on an earlier commit and on the working tree, medians and ratios side by side.

  python -m benchmarks.ab --base=REV --key=images_per_sec.framework [--rounds=3] -- \
      python -m benchmarks.throughput --config=configs/digits_cnn.py --out={out}
  python -m benchmarks.ab --base=REV --key=examples_per_sec --json=summary.json -- \
      python main.py --config=configs/digits_cnn.py --workdir={workdir}

Without --base both sides run the working tree, and --base_args / --head_args (appended to the command) make the
difference, e.g. the cost of an option:

  python -m benchmarks.ab --key=examples_per_sec --json=summary.json \
      --base_args=--config.model.sync_batchnorm=False --head_args=--config.model.sync_batchnorm=True -- \
      python main.py --config=configs/cifar_resnet20.py:synthetic --config.cpu_replicas=2 --workdir={workdir}

The base commit is checked out in a temporary git worktree; every round runs base then head (the working tree)
with the same interpreter, so machine noise hits both alike. `{out}` and `{workdir}` in the command become fresh
paths per run, `{head}` this checkout (a script of the working tree run on both sides, as benchmarks/suite.py);
each --key (dotted path into the run's JSON: --out's file, or --json inside the workdir; a key holding dots, a file
name, is matched whole) is reported as the median per side and the ratio head / base.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

_BASE = flags.DEFINE_string("base", None, "The commit to compare against (the working tree is 'head'); unset: the "
                            "working tree on both sides.")
_BASE_ARGS = flags.DEFINE_multi_string("base_args", [], "Arguments appended to the command on the base side.")
_HEAD_ARGS = flags.DEFINE_multi_string("head_args", [], "Arguments appended to the command on the head side.")
_KEYS = flags.DEFINE_multi_string("key", [], "Dotted path of a number in the run's JSON (repeatable).")
_JSON = flags.DEFINE_string("json", None, "With {workdir}: the JSON file inside it to read (e.g. summary.json).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds of (base, head).")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lookup(results, dotted):
  """The number at a dotted path; a key holding dots itself (a file name) is matched whole."""
  parts = dotted.split(".")
  while parts:
    key = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in results), None)
    if key is None:
      raise SystemExit(f"--key={dotted}: no {'.'.join(parts)!r} in the run's JSON (keys: {', '.join(results)})")
    results, parts = results[key], parts[len(key.split(".")):]
  return float(results)


def run_once(command, cwd, scratch, name):
  out, workdir = os.path.join(scratch, name + ".json"), os.path.join(scratch, name)
  args = [a.replace("{out}", out).replace("{workdir}", workdir).replace("{head}", REPO) for a in command]
  args = [sys.executable if a == "python" else a for a in args]
  done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"{name} failed:\n{(done.stdout + done.stderr)[-3000:]}")
  with open(os.path.join(workdir, _JSON.value) if _JSON.value else out) as f:
    return json.load(f)


def main(argv):
  command = argv[1:]
  if command and command[0] == "--":
    command = command[1:]
  if not command or not _KEYS.value:
    raise app.UsageError("give --key=... and the command after --")
  if not _BASE.value and not (_BASE_ARGS.value or _HEAD_ARGS.value):
    raise app.UsageError("give --base=REV, or --base_args/--head_args to compare two variants of the working tree")
  scratch = tempfile.mkdtemp(prefix="ab-")
  base_tree = os.path.join(scratch, "base") if _BASE.value else REPO
  if _BASE.value:
    subprocess.run(["git", "worktree", "add", "--detach", base_tree, _BASE.value], cwd=REPO, check=True,
                   capture_output=True)
  values = {"base": {k: [] for k in _KEYS.value}, "head": {k: [] for k in _KEYS.value}}
  sides = (("base", base_tree, _BASE_ARGS.value), ("head", REPO, _HEAD_ARGS.value))
  try:
    for round_ in range(_ROUNDS.value):
      for side, cwd, extra in sides:
        results = run_once(command + extra, cwd, scratch, f"{side}{round_}")
        for key in _KEYS.value:
          values[side][key].append(lookup(results, key))
        print(f"[ab] round {round_ + 1} {side}: " + ", ".join(f"{k}={v[-1]:.4g}" for k, v in values[side].items()),
              flush=True)
  finally:
    if _BASE.value:
      subprocess.run(["git", "worktree", "remove", "--force", base_tree], cwd=REPO, capture_output=True)
  summary = {}
  for key in _KEYS.value:
    base, head = statistics.median(values["base"][key]), statistics.median(values["head"][key])
    ratio = head / base if base else None
    summary[key] = {"base": values["base"][key], "head": values["head"][key], "ratio_head_vs_base": ratio}
    shown = "n/a" if ratio is None else f"{ratio:.3f}"
    print(f"[ab] {key}: base median {base:.4g}, head median {head:.4g}, head/base {shown} "
          f"(base {[round(v, 4) for v in values['base'][key]]}, head {[round(v, 4) for v in values['head'][key]]})")
  print(json.dumps({"base": _BASE.value, "base_args": _BASE_ARGS.value, "head_args": _HEAD_ARGS.value,
                    "command": command, "results": summary}))
  return 0


if __name__ == "__main__":
  app.run(main)
