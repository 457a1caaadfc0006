"""Sweeps: every combination of a few config values (or N random draws), each an ordinary main.py run.

  python -m launch.sweep --config=configs/digits_cnn.py --sweep_dir=runs/sweep \\
      --grid optimizer.learning_rate=0.02,0.1 --grid train.global_batch_size=32,64 --parallel 2
  python -m launch.sweep ... --grid optimizer.learning_rate=loguniform:1e-3:1 --random 8 --seed 0
  python -m launch.sweep ... --grid optimizer.learning_rate=loguniform:1e-4:1 --search=tpe --trials 8 --prune=asha
  python -m launch.sweep ... --slurm [--submit]          one SLURM job array (DIR/sweep.sbatch)
  python -m launch.sweep --sweep_dir=runs/sweep --report  the table again (DIR/report.csv, DIR/report.md)

Flags after `--` go to every trial's main.py (e.g. -- --config.train.steps=500). Trial i runs in
DIR/<name from its overrides> (e.g. runs/sweep/learning_rate=0.1,global_batch_size=64), so resume, the workdir lock,
preemption and every check apply as in any run; rerunning the same command skips complete trials (a summary.json
written with the current settings) and resumes the others. --search=tpe and --prune use an Optuna study in
DIR/study.log (launch/sweep_study.py); the runs report each eval to it and are pruned inside
(loops/callbacks/sweep_trial.py). Before any trial starts the first one is checked with `main.py --dry_run` (an unknown key
or a bad value: one error line). At the end: DIR/report.csv and DIR/report.md sorted by checkpoint.best_metric,
and the HParams experiment at DIR (`tensorboard --logdir DIR`: the HParams tab lists every trial).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile

from launch import local
from launch import sweep_grid
from launch import sweep_hparams
from launch import sweep_local
from launch import sweep_lock
from launch import sweep_report
from launch import sweep_slurm
from launch import sweep_study
from launch import sweep_tracking

TRIALS = "trials.json"
INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C (main.py's too)
RESERVED = ("--config=", "--workdir=", "--config ", "--workdir ")


def parse(argv):
  parser = argparse.ArgumentParser(prog="python -m launch.sweep", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--config", help="config file, as main.py takes it (configs/X.py[:arg])")
  parser.add_argument("--sweep_dir", required=True, help="the sweep's directory: one workdir per trial inside")
  parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                      help="a config key and its values (repeat for more keys; every combination is a trial)")
  parser.add_argument("--search", choices=sweep_study.SEARCHES, help="grid (every combination; the default), "
                      "random (--trials N draws), tpe (Optuna's TPE sampler proposes --trials N from the results)")
  parser.add_argument("--trials", type=int, metavar="N", help="with --search=random|tpe: how many trials")
  parser.add_argument("--random", type=int, metavar="N", help="the same as --search=random --trials N")
  parser.add_argument("--prune", choices=sweep_study.PRUNERS, default="none",
                      help="stop losing trials at an eval: Optuna's SuccessiveHalvingPruner (asha) or HyperbandPruner")
  parser.add_argument("--seed", type=int, default=0, help="the seed of the random draws and of tpe (default 0)")
  parser.add_argument("--parallel", type=int, default=1, metavar="K", help="trials at a time on this machine")
  parser.add_argument("--slurm", action="store_true", help="write DIR/sweep.sbatch (one job array) instead of running")
  parser.add_argument("--submit", action="store_true", help="with --slurm: submit it with sbatch")
  parser.add_argument("--report", action="store_true", help="only write and print the report of DIR/trials.json")
  parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then more main.py flags for every trial")
  args = parser.parse_args(argv)
  args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
  args.random_clash = args.random is not None and (args.search not in (None, "random")
                                                   or args.trials not in (None, args.random))
  if args.random is not None and not args.random_clash:
    args.search, args.trials = "random", args.random
  args.search = args.search or "grid"
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
  if args.random_clash:
    raise sweep_grid.SweepError("--random N is --search=random --trials N: give one of them")
  if args.search == "grid" and args.trials is not None:
    raise sweep_grid.SweepError("--trials is for --search=random|tpe; --search=grid runs every combination")
  if args.search != "grid" and (args.trials is None or args.trials < 1):
    raise sweep_grid.SweepError(f"--search={args.search} needs --trials N with N >= 1 (got {args.trials})")
  for arg in args.extra:
    if arg.startswith(RESERVED) or arg in ("--config", "--workdir"):
      raise sweep_grid.SweepError(f"{arg!r} after --: the sweep sets --config and each trial's --workdir itself")


def absolute_config(config):
  """configs/X.py[:arg] with the file's path made absolute (trials run from the repository root)."""
  path, sep, arg = config.partition(":")
  return os.path.abspath(path) + sep + arg if os.path.exists(path) else config


def dry_run(config, trial, extra_args):
  """main.py --dry_run of one trial in a throw-away workdir: SweepError with main.py's error line if it fails;
  else (checkpoint.best_metric, best_mode, the trackers it turns on) as the run reports them."""
  with tempfile.TemporaryDirectory(prefix="sweep-dry-run-") as scratch:
    command = sweep_local.trial_command(config, {**trial, "workdir": os.path.join(scratch, "w")},
                                        [*extra_args, "--dry_run"])
    done = subprocess.run(command, cwd=sweep_local.REPO, capture_output=True, text=True, check=False,
                          preexec_fn=local.dying_with_this_process(signal.SIGKILL))  # it trains nothing
  if done.returncode != 0:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    what = errors[-1][len("error: "):] if errors else (done.stderr.strip().splitlines() or ["?"])[-1]
    raise sweep_grid.SweepError(f"{what} (main.py --dry_run of trial {trial['name']})")
  found = re.search(r"^\s*best_metric: (\S+) \((max|min)\)$", done.stdout, re.M)
  tracking = sweep_tracking.from_dry_run(done.stdout)
  return (found.group(1), found.group(2), tracking) if found else (None, None, tracking)


def probe(grid):
  """A point of the space for the dry run of a tpe sweep: each range's low end, each list's first value."""
  point = {key: (f"{values.low:g}" if isinstance(values, sweep_grid.Range) else values[0])
           for key, values in grid.items()}
  return {"index": 0, "name": sweep_grid.trial_name(point), "overrides": point}


def _checked_before(sweep, previous):
  """A rerun with the same config, extra flags, space and search as the recorded sweep (whose dry run passed then;
  each trial's main.py checks everything again anyway)."""
  keys = ("config", "extra_args", "grid", "search", "prune")
  return bool(previous) and all(previous.get(k) == sweep[k] for k in keys) and "metric" in previous and (
      "tracking" in previous)


def plan(args):
  """The sweep's record, checked: {'config', 'extra_args', 'grid', 'search', 'count', 'prune', 'seed', 'trials':
  [... 'workdir', 'settings']} (a tpe sweep's trials come from its study, as they are asked) and the grid."""
  check_args(args)
  grid = sweep_grid.parse_grid(args.grid)
  config = absolute_config(args.config)
  trials = [] if args.search == "tpe" else sweep_grid.trials(grid, args.trials, args.seed)
  for trial in trials:
    sweep_local.settle(trial, args.sweep_dir, config, args.extra)
  recorded_grid = {k: repr(v) if isinstance(v, sweep_grid.Range) else v for k, v in grid.items()}
  return {"config": config, "extra_args": args.extra, "specs": args.grid, "grid": recorded_grid,
          "search": args.search, "count": args.trials if args.trials else len(trials), "prune": args.prune,
          "random": args.trials if args.search == "random" else None, "seed": args.seed, "trials": trials}, grid


def report(sweep_dir, sweep, out):
  markdown = sweep_report.write(sweep_dir, sweep["trials"], sweep.get("count"))
  out.write(markdown + f"[sweep] report: {os.path.join(sweep_dir, 'report.md')} (and report.csv); "
                       f"tensorboard --logdir {sweep_dir}\n")
  out.flush()


def main(argv=None, out=sys.stdout):
  """The sweep (or --report); returns the exit code. One sweep per directory: the lock is taken before anything is
  written, and a sweep error of any phase is one `error:` line."""
  args = parse(sys.argv[1:] if argv is None else argv)
  trials_path = os.path.join(args.sweep_dir, TRIALS)
  lock = None
  try:
    if args.report:
      return _report_only(args.sweep_dir, trials_path, out)
    sweep, grid = plan(args)
    lock = sweep_lock.SweepLock(args.sweep_dir).acquire(out)  # one sweep per directory, before anything is written
    return _sweep(args, sweep, grid, trials_path, out)
  except sweep_grid.SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # before or after the trials (while they run, sweep_local stops them and they save)
    print("interrupted (Ctrl-C): no trial was running; the same command goes on from here", file=sys.stderr)
    return INTERRUPTED
  finally:
    if lock is not None:
      lock.release()


def _sweep(args, sweep, grid, trials_path, out):
  """Checks the first trial (or finds it checked before), opens the study, writes trials.json, runs the trials (or
  writes the SLURM script) and reports; returns the exit code."""
  previous = sweep_report.read_json(trials_path)
  _judged_by(sweep, grid, previous)
  study = None
  if sweep_study.uses_study(sweep["search"], sweep["prune"]):
    study = sweep_study.open_study(os.path.join(args.sweep_dir, sweep_study.STUDY_FILE), sweep_study.record_of(sweep))
  if previous and any(previous.get(k) != sweep[k] for k in ("config", "extra_args")):
    out.write("[sweep] the config or the flags after -- differ from the recorded sweep's: every trial starts again "
              "(a complete one trains on if its length grew, else evaluates again)\n")
  if study is not None:
    sweep["trials"] = _study_trials(study, sweep, args.sweep_dir, assign=True)
  sweep_report.write_json(trials_path, sweep)
  _write_experiment(args.sweep_dir, sweep, grid)
  if args.slurm:
    sweep_tracking.open_parent(args.sweep_dir, sweep["tracking"], sweep)
    return _slurm(args, sweep, trials_path, out)
  more, on_end = _study_hooks(study, sweep, grid, trials_path)
  sweep_tracking.open_parent(args.sweep_dir, sweep["tracking"], sweep)
  code = sweep_local.run(sweep["config"], sweep["trials"], sweep["extra_args"], args.parallel, out,
                         more=more, on_end=on_end)
  sweep_tracking.close_parent(args.sweep_dir, code)
  if study is not None:  # every trial the study was asked, one asked as a Ctrl-C came before it started included
    sweep["trials"] = _study_trials(study, sweep, args.sweep_dir)
  _write_experiment(args.sweep_dir, sweep, grid)  # again: checkpoint.best_metric is known from the trials now
  report(args.sweep_dir, sweep, out)
  return code


def _judged_by(sweep, grid, previous):
  """Sets sweep['metric'] and ['mode'] (checkpoint.best_metric): from main.py --dry_run of the first trial (a
  point of the space for tpe), or as recorded when the dry run passed before with the same settings."""
  if _checked_before(sweep, previous):
    sweep["metric"], sweep["mode"], sweep["tracking"] = previous["metric"], previous["mode"], previous["tracking"]
    return
  first = sweep["trials"][0] if sweep["trials"] else probe(grid)
  sweep["metric"], sweep["mode"], sweep["tracking"] = dry_run(sweep["config"], first, sweep["extra_args"])
  if not sweep["metric"] and sweep_study.uses_study(sweep["search"], sweep["prune"]):
    raise sweep_grid.SweepError(f"--search={sweep['search']} --prune={sweep['prune']} judges trials by "
                                "checkpoint.best_metric, which is off: set it (e.g. -- --config.checkpoint.best_metric"
                                "=eval/accuracy)")


def _study_trials(study, sweep, sweep_dir, assign=False):
  """The trials the study holds, each with its workdir and settings; assign: failed ones get a new Optuna trial."""
  known = sweep_study.known(study, sweep_dir)
  if assign:
    known = [sweep_study.assign(study, sweep_dir, t["index"], None) for t in known]
  return [sweep_local.settle(t, sweep_dir, sweep["config"], sweep["extra_args"])
          for t in known if t["index"] < sweep["count"]]


def _study_hooks(study, sweep, grid, trials_path):
  """(more, on_end) for sweep_local.run: the study's next trials as slots free, failed runs told FAIL."""
  if study is None:
    return None, None
  sweep_dir = os.path.dirname(trials_path)
  fixed = {t["index"]: t["overrides"] for t in sweep_study.fixed_points(sweep, grid)}

  def ask(index):
    trial = sweep_study.assign(study, sweep_dir, index, grid, fixed.get(index))
    sweep_local.settle(trial, sweep_dir, sweep["config"], sweep["extra_args"])
    sweep_report.write_json(trials_path, sweep)  # sweep["trials"] gets it appended by the caller
    return trial

  def on_end(trial, code):
    if code not in (0, sweep_report.PREEMPTED):
      sweep_study.fail(study, trial["number"])

  return (sweep["count"], ask), on_end


def _report_only(sweep_dir, trials_path, out):
  sweep = sweep_report.read_json(trials_path)
  if not sweep:
    raise sweep_grid.SweepError(f"no sweep in {sweep_dir} (no {TRIALS}): run the sweep first")
  if sweep_study.uses_study(sweep.get("search", "grid"), sweep.get("prune", "none")):
    study = sweep_study.open_study(os.path.join(sweep_dir, sweep_study.STUDY_FILE), sweep_study.record_of(sweep))
    sweep["trials"] = _study_trials(study, sweep, sweep_dir)
  report(sweep_dir, sweep, out)
  return 0


def _write_experiment(sweep_dir, sweep, grid):
  metric, _ = sweep_report.metric_of(sweep_dir, sweep["trials"])
  sweep_hparams.write_experiment(sweep_dir, grid, dict.fromkeys([metric, "eval/accuracy", "eval/loss"]))


def _slurm(args, sweep, trials_path, out):
  script = sweep_slurm.write_script(args.sweep_dir, trials_path, sweep["count"], sweep_local.REPO)
  out.write(f"[sweep] {sweep['count']} trials as one job array: {script}\n")
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
