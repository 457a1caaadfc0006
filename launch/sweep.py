"""Sweeps: every combination of a few config values (or N random draws), each an ordinary main.py run.

  python -m launch.sweep --config=configs/digits_cnn.py --sweep_dir=runs/sweep \\
      --grid optimizer.learning_rate=0.02,0.1 --grid train.global_batch_size=32,64 --parallel 2
  python -m launch.sweep ... --grid optimizer.learning_rate=loguniform:1e-3:1 --random 8 --seed 0
  python -m launch.sweep ... --slurm [--submit]          one SLURM job array (DIR/sweep.sbatch)
  python -m launch.sweep --sweep_dir=runs/sweep --report  the table again (DIR/report.csv, DIR/report.md)

Flags after `--` go to every trial's main.py (e.g. -- --config.train.steps=500). Trial i runs in
DIR/<name from its overrides> (e.g. runs/sweep/learning_rate=0.1,global_batch_size=64), so resume, the workdir lock,
preemption and every check apply as in any run; rerunning the same command skips complete trials (summary.json)
and resumes the others. Before any trial starts the first one is checked with `main.py --dry_run` (an unknown key
or a bad value: one error line). At the end: DIR/report.csv and DIR/report.md sorted by checkpoint.best_metric,
and the HParams experiment at DIR (`tensorboard --logdir DIR`: the HParams tab lists every trial).
"""

import argparse
import os
import subprocess
import sys
import tempfile

from launch import sweep_grid
from launch import sweep_hparams
from launch import sweep_local
from launch import sweep_report
from launch import sweep_slurm

TRIALS = "trials.json"
RESERVED = ("--config=", "--workdir=", "--config ", "--workdir ")


def parse(argv):
  parser = argparse.ArgumentParser(prog="python -m launch.sweep", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--config", help="config file, as main.py takes it (configs/X.py[:arg])")
  parser.add_argument("--sweep_dir", required=True, help="the sweep's directory: one workdir per trial inside")
  parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                      help="a config key and its values (repeat for more keys; every combination is a trial)")
  parser.add_argument("--random", type=int, metavar="N", help="N trials drawn from the grid instead of all of it")
  parser.add_argument("--seed", type=int, default=0, help="the seed of --random's draws (default 0)")
  parser.add_argument("--parallel", type=int, default=1, metavar="K", help="trials at a time on this machine")
  parser.add_argument("--slurm", action="store_true", help="write DIR/sweep.sbatch (one job array) instead of running")
  parser.add_argument("--submit", action="store_true", help="with --slurm: submit it with sbatch")
  parser.add_argument("--report", action="store_true", help="only write and print the report of DIR/trials.json")
  parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then more main.py flags for every trial")
  args = parser.parse_args(argv)
  args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
  args.sweep_dir = os.path.abspath(args.sweep_dir)
  return args


def check_args(args):
  """SweepError for input no trial could run with."""
  if args.parallel < 1:
    raise sweep_grid.SweepError(f"--parallel must be >= 1, got {args.parallel}")
  if args.submit and not args.slurm:
    raise sweep_grid.SweepError("--submit needs --slurm")
  if not args.config:
    raise sweep_grid.SweepError("give --config=configs/X.py (the config every trial starts from)")
  for arg in args.extra:
    if arg.startswith(RESERVED) or arg in ("--config", "--workdir"):
      raise sweep_grid.SweepError(f"{arg!r} after --: the sweep sets --config and each trial's --workdir itself")


def absolute_config(config):
  """configs/X.py[:arg] with the file's path made absolute (trials run from the repository root)."""
  path, sep, arg = config.partition(":")
  return os.path.abspath(path) + sep + arg if os.path.exists(path) else config


def dry_run(config, trial, extra_args):
  """main.py --dry_run of one trial in a throw-away workdir: SweepError with main.py's error line if it fails."""
  with tempfile.TemporaryDirectory(prefix="sweep-dry-run-") as scratch:
    command = sweep_local.trial_command(config, {**trial, "workdir": os.path.join(scratch, "w")},
                                        [*extra_args, "--dry_run"])
    done = subprocess.run(command, cwd=sweep_local.REPO, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    what = errors[-1][len("error: "):] if errors else (done.stderr.strip().splitlines() or ["?"])[-1]
    raise sweep_grid.SweepError(f"{what} (main.py --dry_run of trial {trial['name']})")


def _checked_before(sweep, previous):
  """A rerun with the same config, extra flags and keys as the recorded sweep, whose first trial started before:
  its --dry_run passed then (each trial's main.py checks everything again anyway)."""
  return bool(previous) and all(previous.get(k) == sweep[k] for k in ("config", "extra_args")) and (
      previous["trials"][:1] == sweep["trials"][:1]) and os.path.exists(
          os.path.join(sweep["trials"][0]["workdir"], "config.json"))


def plan(args):
  """The sweep's record, checked: {'config', 'extra_args', 'grid', 'trials': [... 'workdir']}."""
  check_args(args)
  grid = sweep_grid.parse_grid(args.grid)
  trials = sweep_grid.trials(grid, args.random, args.seed)
  for trial in trials:
    trial["workdir"] = os.path.join(args.sweep_dir, trial["name"])
  config = absolute_config(args.config)
  return {"config": config, "extra_args": args.extra, "grid": {k: repr(v) if isinstance(v, sweep_grid.Range) else v
                                                                for k, v in grid.items()},
          "random": args.random, "seed": args.seed, "trials": trials}, grid


def report(sweep_dir, trials, out):
  markdown = sweep_report.write(sweep_dir, trials)
  out.write(markdown + f"[sweep] report: {os.path.join(sweep_dir, 'report.md')} (and report.csv); "
                       f"tensorboard --logdir {sweep_dir}\n")
  out.flush()


def main(argv=None, out=sys.stdout):
  args = parse(sys.argv[1:] if argv is None else argv)
  trials_path = os.path.join(args.sweep_dir, TRIALS)
  try:
    if args.report:
      sweep = sweep_report.read_json(trials_path)
      if not sweep:
        raise sweep_grid.SweepError(f"no sweep in {args.sweep_dir} (no {TRIALS}): run the sweep first")
      report(args.sweep_dir, sweep["trials"], out)
      return 0
    sweep, grid = plan(args)
    previous = sweep_report.read_json(trials_path)
    if not _checked_before(sweep, previous):
      dry_run(sweep["config"], sweep["trials"][0], sweep["extra_args"])
  except sweep_grid.SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  sweep["rerun_complete"] = bool(previous) and any(previous.get(k) != sweep[k] for k in ("config", "extra_args"))
  if sweep["rerun_complete"]:
    out.write("[sweep] the config or the flags after -- differ from the recorded sweep's: every trial starts again "
              "(a complete one trains on if its length grew, else evaluates again)\n")
  os.makedirs(args.sweep_dir, exist_ok=True)
  sweep_report.write_json(trials_path, sweep)
  _write_experiment(args.sweep_dir, sweep, grid)
  if args.slurm:
    return _slurm(args, sweep, trials_path, out)
  code = sweep_local.run(sweep["config"], sweep["trials"], sweep["extra_args"], args.parallel, out,
                         rerun_complete=sweep["rerun_complete"])
  _write_experiment(args.sweep_dir, sweep, grid)  # again: checkpoint.best_metric is known from the trials now
  report(args.sweep_dir, sweep["trials"], out)
  return code


def _write_experiment(sweep_dir, sweep, grid):
  metric, _ = sweep_report.metric_of(sweep_dir, sweep["trials"])
  sweep_hparams.write_experiment(sweep_dir, grid, dict.fromkeys([metric, "eval/accuracy", "eval/loss"]))


def _slurm(args, sweep, trials_path, out):
  script = sweep_slurm.write_script(args.sweep_dir, trials_path, len(sweep["trials"]), sweep_local.REPO)
  out.write(f"[sweep] {len(sweep['trials'])} trials as one job array: {script}\n")
  if not args.submit:
    out.write(f"[sweep] submit with: sbatch {script}\n")
    return 0
  try:
    done = subprocess.run(["sbatch", script], capture_output=True, text=True, check=False)
  except FileNotFoundError:
    print(f"error: sbatch is not on PATH (not a SLURM login node?); {script} is written: submit it there",
          file=sys.stderr)
    return 1
  out.write(done.stdout)
  if done.returncode != 0:
    print(f"error: sbatch {script} failed: {done.stderr.strip()}", file=sys.stderr)
  return done.returncode


if __name__ == "__main__":
  sys.exit(main())
