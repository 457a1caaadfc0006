"""A sweep as one SLURM job array: DIR/sweep.sbatch, whose SLURM_ARRAY_TASK_ID picks a trial of DIR/trials.json.

Each array task runs its trial's main.py through launch/slurm/run_and_requeue.sh (time limit -> checkpoint ->
`scontrol requeue` of that array task -> resume on the same workdir), with its own cluster.slurm_port_base:
20000 + ((SLURM_ARRAY_JOB_ID + task id) % 199) * 64, so up to 199 tasks of an array sharing a node never share a
port. A task whose trial is already complete (its summary.json proves the current settings) exits 0 at once. With an
Optuna study (--search=tpe, --prune), task i asks the study for sweep trial i on its first start (sampled from the
results so far) and finds the same trial on a requeue; the runs report to the shared study in DIR/study.log.

  python -m launch.sweep_slurm DIR/trials.json TASK_ID   prints the task's shell assignments (used by the script)
"""

import os
import shlex
import sys

from launch import sweep_grid
from launch import sweep_local
from launch import sweep_report
from launch import sweep_lock
from launch import sweep_study

PORT_BASE, PORT_SLOTS, PORTS_PER_TASK = 20000, 199, 64

TEMPLATE = """#!/bin/bash
# A sweep of {count} trials as one job array (written by python -m launch.sweep --slurm). Submit from anywhere:
#   sbatch {script}
# Give nodes, GPUs and CPUs per task on the sbatch line (e.g. --gres=gpu:1 --cpus-per-task=8); the trials are
# listed in {trials}; logs: {sweep_dir}/slurm-%A_%a.out. Rerunning the array skips complete trials and resumes
# unfinished ones. Env overrides: PYTHON, PREEMPTION_EXIT_CODE, MAX_SIGNAL_REQUEUES, EXTRA_ARGS.
#
#SBATCH --job-name={job_name}
#SBATCH --array=0-{last}
#SBATCH --ntasks=1
#SBATCH --output={sweep_dir}/slurm-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
set -euo pipefail
cd {repo}
PYTHON=${{PYTHON:-{python}}}
# One sweep per directory (launch/sweep_lock.py): the array's tasks share {sweep_dir}/sweep.lock, a sweep started with
# launch.sweep holds it alone, so each refuses the other in one line (the kernel's flock, held by this shell's fd 9
# while the task runs; across nodes it needs a filesystem with flock, as NFSv4 and Lustre mounted -o flock have).
exec 9<>{lock}
"$PYTHON" -m launch.sweep_lock --shared=9 {sweep_dir_quoted} || exit 1
# The selection: this array task's trial (TRIAL_NAME, TRIAL_WORKDIR, TRIAL_ARGS, TRIAL_COMPLETE, PORT_BASE).
SELECTION=$("$PYTHON" -m launch.sweep_slurm {trials} "${{SLURM_ARRAY_TASK_ID:?not a SLURM array task}}")
eval "$SELECTION"
echo "[sweep] array task $SLURM_ARRAY_TASK_ID: trial $TRIAL_NAME in $TRIAL_WORKDIR (ports from $PORT_BASE)" >&2
if [ -n "${{SWEEP_SELECT_ONLY:-}}" ]; then
  printf '%s\\n' "$TRIAL_NAME" "$TRIAL_WORKDIR" "$PORT_BASE" "$TRIAL_COMPLETE" "${{TRIAL_ARGS[@]}}"
  exit 0
fi
if [ "$TRIAL_COMPLETE" = 1 ]; then
  echo "[sweep] $TRIAL_NAME is complete (summary.json): nothing to do" >&2
  exit 0
fi
source launch/slurm/run_and_requeue.sh
REQUEUE_RECORD="$TRIAL_WORKDIR/slurm_requeues.txt"
run_or_requeue "$PYTHON" main.py --workdir="$TRIAL_WORKDIR" "${{TRIAL_ARGS[@]}}" \\
    --config.cluster.slurm_port_base="$PORT_BASE" "${{TRAIN_ARGS[@]}}"
"""


def write_script(sweep_dir, trials_path, count, repo, python=sys.executable):
  """Writes DIR/sweep.sbatch for `count` trials; returns its path."""
  script = os.path.join(sweep_dir, "sweep.sbatch")
  text = TEMPLATE.format(count=count, script=shlex.quote(script), trials=shlex.quote(trials_path),
                         lock=shlex.quote(os.path.join(sweep_dir, sweep_lock.LOCK_NAME)),
                         sweep_dir_quoted=shlex.quote(sweep_dir),
                         sweep_dir=sweep_dir, job_name=f"sweep-{os.path.basename(sweep_dir.rstrip('/'))}",
                         last=count - 1, repo=shlex.quote(repo), python=shlex.quote(python))
  with open(script, "w") as f:
    f.write(text)
  os.chmod(script, 0o755)
  return script


def port_base(array_job_id, task_id):
  """The task's cluster.slurm_port_base: distinct for the tasks of one array (up to 199 of them)."""
  return PORT_BASE + ((array_job_id + task_id) % PORT_SLOTS) * PORTS_PER_TASK


def selection(trials_path, task_id, array_job_id):
  """The shell assignments for array task `task_id` of the sweep in trials_path (with an Optuna study: the study's
  trial for this array task, asked now on its first start)."""
  sweep = sweep_report.read_json(trials_path)
  count = (sweep.get("count") or len(sweep["trials"])) if sweep else 0
  if not sweep or not 0 <= task_id < count:
    raise SystemExit(f"error: array task {task_id} has no trial in {trials_path} ({count} trials: 0-{count - 1})")
  trial = _trial(sweep, os.path.dirname(trials_path), task_id)
  skip = sweep_report.is_complete(trial["workdir"], trial.get("settings"))
  args = [f"--config={sweep['config']}"]
  args += [f"--config.{key}={value}" for key, value in trial["overrides"].items()]
  args += [*sweep_local.TRIAL_FLAGS, *sweep_local.sweep_flags(trial), *sweep["extra_args"]]
  return "\n".join([f"TRIAL_NAME={shlex.quote(trial['name'])}", f"TRIAL_WORKDIR={shlex.quote(trial['workdir'])}",
                    f"TRIAL_ARGS=({' '.join(shlex.quote(a) for a in args)})",
                    f"TRIAL_COMPLETE={int(skip)}",
                    f"PORT_BASE={port_base(array_job_id, task_id)}"]) + "\n"


def _trial(sweep, sweep_dir, index):
  """Trial `index` with its workdir and settings: from trials.json, or from the sweep's study."""
  config, extra_args = sweep["config"], sweep["extra_args"]
  if not sweep_study.uses_study(sweep.get("search", "grid"), sweep.get("prune", "none")):
    return sweep_local.settle(sweep["trials"][index], sweep_dir, config, extra_args)
  grid = sweep_grid.parse_grid(sweep["specs"])
  study = sweep_study.open_study(os.path.join(sweep_dir, sweep_study.STUDY_FILE), sweep_study.record_of(sweep))
  fixed = {t["index"]: t["overrides"] for t in sweep_study.fixed_points(sweep, grid)}
  trial = sweep_study.assign(study, sweep_dir, index, grid, fixed.get(index))
  return sweep_local.settle(trial, sweep_dir, config, extra_args)


def main(argv):
  if len(argv) != 2 or not argv[1].isdigit():
    raise SystemExit("usage: python -m launch.sweep_slurm DIR/trials.json TASK_ID")
  array_job_id = int(os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID") or 0)
  sys.stdout.write(selection(argv[0], int(argv[1]), array_job_id))


if __name__ == "__main__":
  main(sys.argv[1:])
