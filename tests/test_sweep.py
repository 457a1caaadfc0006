"""launch.sweep: a 2x2 digits sweep, 2 at a time (one trial stopped and resumed by rerunning the sweep, then the
grid extended by a bad value), its table and HParams experiment, the SLURM array script; naming, grid, sampling."""

import csv
import io
import json
import fcntl
import os
import subprocess
import sys
import time

import pytest

from launch import sweep_grid
from launch import sweep_report
from launch import sweep_local
from launch import sweep_lock
from launch import sweep_slurm
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

GRID = ["--grid", "optimizer.learning_rate=0.05,0.1", "--grid", "train.global_batch_size=32,64"]
EXTRA = ["--", "--config.train.steps=30", "--config.train.steps_per_loop=10",
         "--config.eval.every_steps=30", "--config.checkpoint.every_steps=10", "--config.export=False",
         "--config.callbacks=('tests.fixtures.sweep_callbacks:AffinityAndStopOnce',)"]
NAMES = ["learning_rate=0.05,global_batch_size=32", "learning_rate=0.05,global_batch_size=64",
         "learning_rate=0.1,global_batch_size=32", "learning_rate=0.1,global_batch_size=64"]
STOPPED = NAMES[3]


def sweep(sweep_dir, *args, env=None):
  """python -m launch.sweep ... as a user runs it; the CompletedProcess."""
  return subprocess.run([sys.executable, "-m", "launch.sweep", "--config=configs/digits_cnn.py",
                         f"--sweep_dir={sweep_dir}", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                        env={**os.environ, **(env or {})})


def table(sweep_dir):
  with open(os.path.join(sweep_dir, "report.csv")) as f:
    return list(csv.DictReader(f))


def trial_files(sweep_dir, name):
  """(summary.json's bytes and mtime, starts.jsonl's lines) of a trial."""
  workdir = os.path.join(sweep_dir, name)
  summary = os.path.join(workdir, "summary.json")
  with open(os.path.join(workdir, "starts.jsonl")) as f:
    starts = f.read().splitlines()
  if not os.path.exists(summary):
    return None, None, starts
  with open(summary, "rb") as f:
    return f.read(), os.stat(summary).st_mtime_ns, starts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The sweep three times in one directory: first (trial 3 stops itself at step 10 with a checkpoint), the same
  command again, then with a third learning rate of -1 (two failing trials)."""
  sweep_dir, seconds = str(tmp_path_factory.mktemp("sweep")), []
  marker = os.path.join(sweep_dir, "..", "stop-marker")
  open(marker, "w").close()
  env = {"SWEEP_TEST_STOP_TRIAL": STOPPED, "SWEEP_TEST_STOP_MARKER": marker}
  started = time.monotonic()
  first = sweep(sweep_dir, *GRID, "--parallel", "2", *EXTRA, env=env)
  after_first = {"table": table(sweep_dir), "files": {n: trial_files(sweep_dir, n) for n in NAMES}}
  seconds.append(time.monotonic() - started)
  second = sweep(sweep_dir, *GRID, "--parallel", "2", *EXTRA, env=env)
  after_second = {"table": table(sweep_dir), "files": {n: trial_files(sweep_dir, n) for n in NAMES},
                  "markdown": open(os.path.join(sweep_dir, "report.md")).read()}
  seconds.append(time.monotonic() - started - seconds[0])
  third = sweep(sweep_dir, "--grid", "optimizer.learning_rate=0.05,0.1,-1", *GRID[2:], "--parallel", "2", *EXTRA)
  print("sweep seconds (first, second, third):", seconds, time.monotonic() - started - sum(seconds))
  return {"dir": sweep_dir, "runs": (first, second, third), "after_first": after_first,
          "after_second": after_second, "after_third": table(sweep_dir)}


def test_grid_runs_every_trial_in_its_own_workdir_pinned_to_its_cores(runs):
  first = runs["runs"][0]
  assert first.returncode == 143, first.stdout + first.stderr  # one trial unfinished: rerun to resume
  sweep_dir = runs["dir"]
  for name in NAMES:
    with open(os.path.join(sweep_dir, name, "config.json")) as f:
      config = json.load(f)
    lr, batch = name.split(",")
    assert config["optimizer"]["learning_rate"] == float(lr.split("=")[1])
    assert config["train"]["global_batch_size"] == int(batch.split("=")[1])
    with open(os.path.join(sweep_dir, name, "affinity.json")) as f:
      cores = json.load(f)
    with open(os.path.join(sweep_dir, name, "sweep.json")) as f:
      attempt = json.load(f)["attempts"][-1]  # the latest start wrote affinity.json
    shares = [len(slot["cores"]) for slot in sweep_local.slots(2, sorted(os.sched_getaffinity(0)), [])]
    assert cores == attempt["cores"] and len(cores) in shares  # 2 at a time: half of the cores each (1 of 2 here)
    assert config["intra_op_threads"] == config["inter_op_threads"] == len(cores)
    assert "=== sweep " in open(os.path.join(sweep_dir, name, "sweep.log")).read()
  # the first two trials ran at the same time on different cores
  firsts = [json.load(open(os.path.join(sweep_dir, n, "sweep.json")))["attempts"][0]["cores"] for n in NAMES[:2]]
  assert len(os.sched_getaffinity(0)) < 2 or not set(firsts[0]) & set(firsts[1])


def test_the_stopped_trial_is_unfinished_and_the_report_says_so(runs):
  rows = {row["trial"]: row for row in runs["after_first"]["table"]}
  assert set(rows) == set(NAMES)
  assert rows[STOPPED]["status"] == "unfinished" and rows[STOPPED]["step"] in ("10", "20")
  assert all(rows[n]["status"] == "complete" and rows[n]["step"] == "30" for n in NAMES[:3])
  summary, _, starts = runs["after_first"]["files"][STOPPED]
  assert summary is None and len(starts) == 1
  attempt = json.load(open(os.path.join(runs["dir"], STOPPED, "sweep.json")))["attempts"][0]
  assert attempt["exit_code"] == 143 and attempt["preempted"] and "error" not in attempt
  assert f"{STOPPED}: stopped with a checkpoint saved; rerun the sweep to resume" in runs["runs"][0].stdout


def test_rerun_skips_complete_trials_and_resumes_the_unfinished_one(runs):
  second = runs["runs"][1]
  assert second.returncode == 0, second.stdout + second.stderr
  assert "4 trials, 3 complete (skipped), 1 to run" in second.stdout
  assert second.stdout.count("[sweep] start ") == 1 and f"start {STOPPED} " in second.stdout
  for name in NAMES[:3]:  # untouched: no new start, the same summary.json
    assert runs["after_second"]["files"][name] == runs["after_first"]["files"][name]
  _, _, starts = runs["after_second"]["files"][STOPPED]
  assert len(starts) == 2 and json.loads(starts[1])["step"] in (10, 20)  # resumed at its checkpoint
  assert "restored" in open(os.path.join(runs["dir"], STOPPED, "sweep.log")).read()


def test_report_has_every_trial_sorted_by_the_best_metric(runs):
  rows = runs["after_second"]["table"]
  assert [row["trial"] for row in rows] != [] and sorted(row["trial"] for row in rows) == sorted(NAMES)
  best = [float(row["best eval/accuracy"]) for row in rows]
  assert best == sorted(best, reverse=True) and all(0.0 < b <= 1.0 for b in best)
  for row in rows:
    summary = json.load(open(os.path.join(runs["dir"], row["trial"], "summary.json")))
    assert float(row["best eval/accuracy"]) == pytest.approx(summary["eval/accuracy"])  # one eval, at step 30
    assert row["status"] == "complete" and row["step"] == "30" and row["best_step"] == "30"
    assert float(row["wall_seconds"]) > 0
    assert row["optimizer.learning_rate"] in ("0.05", "0.1") and row["train.global_batch_size"] in ("32", "64")
  markdown = runs["after_second"]["markdown"].splitlines()
  assert markdown[0].startswith("| trial | optimizer.learning_rate | train.global_batch_size | best eval/accuracy")
  assert [line.split(" | ")[0].lstrip("| ") for line in markdown[2:6]] == [row["trial"] for row in rows]
  assert markdown[6:] == ["", "4 trials: 4 complete; steps spent 120 of 120 for 4 full-length trials (100 %)"]


def test_a_failing_trial_is_listed_with_its_error_line_and_the_others_go_on(runs):
  third = runs["runs"][2]
  assert third.returncode == 1, third.stdout + third.stderr
  assert "6 trials, 4 complete (skipped), 2 to run" in third.stdout
  rows = runs["after_third"]
  assert len(rows) == 6
  failed = [row for row in rows if row["status"] == "failed"]
  assert sorted(row["trial"] for row in failed) == ["learning_rate=-1,global_batch_size=32",
                                                    "learning_rate=-1,global_batch_size=64"]
  for row in failed:
    assert row["error"] == "error: optimizer.learning_rate must be > 0, got -1.0"
    assert row["best eval/accuracy"] == ""
  assert [row["status"] for row in rows[:4]] == ["complete"] * 4 and rows[4:] == failed  # failed ones last
  again = sweep(runs["dir"], "--report")  # the table again, nothing run
  assert again.returncode == 0 and "[sweep] start" not in again.stdout
  assert again.stdout.splitlines()[2].startswith(f"| {rows[0]['trial']} |") and len(again.stdout.splitlines()) == 11
  assert table(runs["dir"]) == rows


def test_tensorboard_hparams_shows_every_trial_under_the_swept_keys(runs):
  from tensorboard import context
  from tensorboard.backend.event_processing import data_provider
  from tensorboard.backend.event_processing import plugin_event_multiplexer
  from tensorboard.plugins import base_plugin
  from tensorboard.plugins.hparams import backend_context
  from tensorboard.plugins.hparams import metadata

  multiplexer = plugin_event_multiplexer.EventMultiplexer()
  multiplexer.AddRunsFromDirectory(runs["dir"])
  multiplexer.Reload()
  provider = data_provider.MultiplexerDataProvider(multiplexer, runs["dir"])
  backend = backend_context.Context(base_plugin.TBContext(logdir=runs["dir"], multiplexer=multiplexer,
                                                          data_provider=provider))
  request = context.RequestContext()
  content = backend.hparams_metadata(request, "")
  experiments = [run for run, tags in content.items() if metadata.EXPERIMENT_TAG in tags]
  assert experiments == ["."]  # one experiment, at the sweep's directory; the trials write only their sessions
  sessions = {run for run, tags in content.items() if metadata.SESSION_START_INFO_TAG in tags}
  assert sessions == set(NAMES)  # the failing trials stopped before writing anything
  experiment = backend.experiment_from_metadata(request, "", True, content,
                                                backend.hparams_from_data_provider(request, "", None))
  assert [h.name for h in experiment.hparam_infos] == ["optimizer.learning_rate", "train.global_batch_size"]
  lr = experiment.hparam_infos[0].domain_discrete.values
  assert sorted(v.number_value for v in lr) == [-1.0, 0.05, 0.1]
  assert "eval/accuracy" in [m.name.tag for m in experiment.metric_infos]
  for name in NAMES:
    start = metadata.parse_session_start_info_plugin_data(content[name][metadata.SESSION_START_INFO_TAG])
    assert start.hparams["optimizer.learning_rate"].number_value == pytest.approx(float(name.split(",")[0][14:]))
    assert multiplexer.Tensors(name, "eval/accuracy")  # the metric's values, in the same run


def test_bad_sweep_input_is_one_line_before_any_trial(tmp_path):
  unknown = sweep(tmp_path / "a", "--grid", "optimizer.learnin_rate=0.1,0.2", *EXTRA)
  assert unknown.returncode == 1
  lines = unknown.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and "learnin_rate" in lines[0], unknown.stderr
  assert "main.py --dry_run of trial learnin_rate=0.1" in lines[0]
  assert not (tmp_path / "a").exists()
  empty = sweep(tmp_path / "b", "--grid", "optimizer.learning_rate=0.1,", *EXTRA)
  assert empty.returncode == 1 and empty.stderr.strip().splitlines() == [
      "error: --grid 'optimizer.learning_rate=0.1,': empty value; give one or more values separated by commas, "
      "e.g. optimizer.learning_rate=0.01,0.1"]
  assert not (tmp_path / "b").exists()


def test_slurm_array_task_picks_its_trial_workdir_overrides_and_port_base(runs):
  sweep_dir = runs["dir"]
  written = sweep(sweep_dir, *GRID, "--slurm", *EXTRA)
  assert written.returncode == 0, written.stderr
  script = os.path.join(sweep_dir, "sweep.sbatch")
  text = open(script).read()
  assert "#SBATCH --array=0-3\n" in text and "source launch/slurm/run_and_requeue.sh" in text
  assert "run_or_requeue" in text and "--config.cluster.slurm_port_base=\"$PORT_BASE\"" in text

  def task(task_id, **env):
    return subprocess.run(["bash", script], capture_output=True, text=True, timeout=120, cwd="/",
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": str(task_id), "SLURM_ARRAY_JOB_ID": "1000",
                               "SLURM_JOB_ID": "1003", "PATH": os.environ["PATH"], **env})

  picked = task(2, SWEEP_SELECT_ONLY="1")
  assert picked.returncode == 0, picked.stderr
  name, workdir, port, complete, *args = picked.stdout.splitlines()
  assert name == NAMES[2] and workdir == os.path.join(sweep_dir, NAMES[2]) and complete == "1"
  assert int(port) == 20000 + (1002 % 199) * 64 == sweep_slurm.port_base(1000, 2)
  assert args[:3] == [f"--config={os.path.join(REPO, 'configs/digits_cnn.py')}", "--config.optimizer.learning_rate=0.1",
                      "--config.train.global_batch_size=32"]
  settings = sweep_local.settings_of(os.path.join(REPO, "configs/digits_cnn.py"), {
      "optimizer.learning_rate": "0.1", "train.global_batch_size": "32"}, EXTRA[1:])
  assert args[3:] == [*sweep_local.TRIAL_FLAGS, f"--config.sweep.settings={settings}", *EXTRA[1:]]
  ports = {int(task(i, SWEEP_SELECT_ONLY="1").stdout.splitlines()[2]) for i in range(4)}
  assert len(ports) == 4 and all(abs(a - b) >= 64 for a in ports for b in ports if a != b)
  done = task(2)  # the trial is complete: the task ends at once, nothing run
  assert done.returncode == 0 and f"{NAMES[2]} is complete" in done.stderr
  missing = task(7, SWEEP_SELECT_ONLY="1")
  assert missing.returncode != 0 and "array task 7 has no trial" in missing.stderr

  held = sweep_lock.SweepLock(sweep_dir).acquire(io.StringIO())  # a sweep started with launch.sweep runs
  refused = task(2, SWEEP_SELECT_ONLY="1")
  held.release()
  assert refused.returncode == 1 and refused.stdout == ""
  assert refused.stderr.splitlines()[-1].startswith(f"error: sweep directory {sweep_dir} is in use by a sweep started "
                                                    f"with launch.sweep (pid {os.getpid()} on host ")
  share = os.open(os.path.join(sweep_dir, sweep_lock.LOCK_NAME), os.O_RDWR | os.O_CREAT)  # an array task runs
  fcntl.flock(share, fcntl.LOCK_SH)
  try:
    second = sweep(sweep_dir, *GRID, "--slurm", *EXTRA)
  finally:
    os.close(share)
  assert second.returncode == 1 and second.stderr.strip().splitlines()[-1] == (
      f"error: sweep directory {sweep_dir} is in use by the running tasks of a SLURM job array of this sweep "
      "(sweep.sbatch): wait for it to end, or use another --sweep_dir")


def test_trial_names_are_readable_safe_unique_and_stable():
  assert sweep_grid.trial_name({"optimizer.learning_rate": "0.1", "train.global_batch_size": "64"}) == (
      "learning_rate=0.1,global_batch_size=64")
  clash = sweep_grid.trial_name({"a.rate": "1", "b.rate": "2"})
  assert clash == "a.rate=1,b.rate=2"
  odd = sweep_grid.trial_name({"model.kwargs.widths": "(16, 32)"})
  assert odd.startswith("widths=_16__32_-") and "/" not in odd and " " not in odd
  assert odd == sweep_grid.trial_name({"model.kwargs.widths": "(16, 32)"})
  assert odd != sweep_grid.trial_name({"model.kwargs.widths": "(16,_32)"})
  assert "/" not in sweep_grid.trial_name({"data.data_dir": "/tmp/x"})
  assert len(sweep_grid.trial_name({"k": "x" * 500})) <= sweep_grid.MAX_NAME + 9


def test_steps_spent_are_against_each_trials_own_length():
  """A batch size in the grid halves a trial's steps: two complete trials of 2200 and 1100 steps spent all of
  theirs (it said 3300 of 4400, 75 %, as if pruning had saved a quarter); one not started counts as the longest."""
  def row(step, total, from_step=0):
    return {"step": step, "_total_steps": total, "_from_step": from_step}

  assert sweep_report.steps_spent([row(2200, 2200), row(1100, 1100)]) == (3300, 3300)
  assert sweep_report.steps_spent([row(2200, 2200), row(300, 1100), row(None, None)]) == (2500, 5500)
  # a sweep extended from 200 to 2000 steps: 1800 to train with the current settings (it said 300 of 2000, and an
  # extended sweep with every trial complete 33 %)
  assert sweep_report.steps_spent([row(500, 2000, from_step=200)]) == (300, 1800)
  assert sweep_report.steps_spent([row(300, 300, from_step=200), row(300, 300, from_step=200)]) == (200, 200)
  assert sweep_report.steps_spent([row(None, None), row(None, None)]) == (0, 0)
  # a tpe sweep of 4 trials stopped after 2 were asked: the 2 its study has not asked yet count as the longest
  assert sweep_report.steps_spent([row(300, 300), row(120, 300)], unasked=2) == (420, 1200)


def test_grid_parsing_and_points():
  grid = sweep_grid.parse_grid(["optimizer.learning_rate=0.1,0.2", "--config.model.kwargs.widths=(8,16),(16,32)"])
  assert grid == {"optimizer.learning_rate": ["0.1", "0.2"], "model.kwargs.widths": ["(8,16)", "(16,32)"]}
  points = sweep_grid.grid_points(grid)
  assert points[:2] == [{"optimizer.learning_rate": "0.1", "model.kwargs.widths": "(8,16)"},
                        {"optimizer.learning_rate": "0.1", "model.kwargs.widths": "(16,32)"}] and len(points) == 4
  for bad, message in [("lr", "expected KEY=V1,V2"), ("lr=", "empty value"), ("a b=1", "expected KEY=V1,V2"),
                       ("lr=1,,2", "empty value"), ("lr=uniform:1:0", "need LOW < HIGH"),
                       ("lr=loguniform:0:1", "LOW > 0"), ("lr=uniform:0:1,3", "only value")]:
    with pytest.raises(sweep_grid.SweepError, match=message):
      sweep_grid.parse_grid([bad])
  with pytest.raises(sweep_grid.SweepError, match="given twice"):
    sweep_grid.parse_grid(["lr=1", "lr=2"])
  with pytest.raises(sweep_grid.SweepError, match="ranges need --random"):
    sweep_grid.trials(sweep_grid.parse_grid(["lr=loguniform:1e-4:1e-1"]))


def test_random_sampling_is_reproducible_distinct_and_in_range():
  grid = sweep_grid.parse_grid(["optimizer.learning_rate=loguniform:1e-4:1e-1", "train.global_batch_size=32,64",
                                "model.kwargs.depth=int:1:3"])
  first = sweep_grid.trials(grid, 20, seed=3)
  assert first == sweep_grid.trials(grid, 20, seed=3) and first != sweep_grid.trials(grid, 20, seed=4)
  assert len({t["name"] for t in first}) == 20
  for trial in first:
    lr = float(trial["overrides"]["optimizer.learning_rate"])
    assert 1e-4 <= lr <= 1e-1 and trial["overrides"]["optimizer.learning_rate"] == f"{lr:.3g}"
    assert trial["overrides"]["train.global_batch_size"] in ("32", "64")
    assert trial["overrides"]["model.kwargs.depth"] in ("1", "2", "3")
  lrs = sorted(float(t["overrides"]["optimizer.learning_rate"]) for t in first)
  assert lrs[0] < 1e-3 and lrs[-1] > 1e-2  # spread over the decades, not one corner
  discrete = sweep_grid.parse_grid(["a=1,2,3", "b=x,y"])
  picked = sweep_grid.trials(discrete, 4, seed=0)
  assert len({t["name"] for t in picked}) == 4 and [t["index"] for t in picked] == [0, 1, 2, 3]
  assert all(t["overrides"] in sweep_grid.grid_points(discrete) for t in picked)
  with pytest.raises(sweep_grid.SweepError, match="only 6 points"):
    sweep_grid.trials(discrete, 7, seed=0)


def test_slots_share_cores_and_gpus():
  assert sweep_local.slots(2, [0, 1, 2, 3, 4], []) == [{"cores": [0, 1, 2], "gpus": []},
                                                      {"cores": [3, 4], "gpus": []}]
  assert sweep_local.slots(3, [0, 1], ["0"]) == [{"cores": [0], "gpus": ["0"]}, {"cores": [1], "gpus": ["0"]},
                                                 {"cores": [0], "gpus": ["0"]}]
  assert sweep_local.slots(2, [0, 1, 2, 3], ["0", "1", "2", "3"])[1] == {"cores": [2, 3], "gpus": ["2", "3"]}
  flags = sweep_local.resource_flags({"cores": [2, 3], "gpus": ["1"]}, {"inter_op_threads"})
  assert flags == ["--config.intra_op_threads=2", "--config.data.pipeline_threads=2"]


def test_a_second_interrupt_while_trials_save_kills_them_at_once():
  """Ctrl-C, then Ctrl-C again during the grace period: no traceback, the trials still saving are killed."""

  class SecondInterrupt:  # the first wait of all is cut short by the second Ctrl-C
    interrupted = False

    def __init__(self):
      self.real = subprocess.Popen(["sleep", "30"], start_new_session=True)
      self.pid = self.real.pid

    def wait(self, timeout=None):
      if not SecondInterrupt.interrupted:
        SecondInterrupt.interrupted = True
        raise KeyboardInterrupt
      return self.real.wait(timeout)

    def poll(self):
      return self.real.poll()

  class Trial:
    def __init__(self):
      self.proc, self.finished = SecondInterrupt(), False

    def stop(self):
      pass  # a trial that takes its time to save

    def finish(self, out):
      self.finished = True

  trials, out = [Trial(), Trial()], io.StringIO()
  sweep_local._stop_all(trials, out)
  assert "[sweep] interrupted again: killing the trials still saving" in out.getvalue()
  assert [t.proc.real.returncode for t in trials] == [-9, -9] and all(t.finished for t in trials)


def test_a_trial_the_sweep_stops_before_it_can_save_is_unfinished_not_failed(tmp_path):
  """Ctrl-C while trials start: SIGTERM reaches a run still importing (no handler yet). It was 'failed: killed by
  signal 15'; nothing failed and nothing was saved."""
  trial = {"name": "learning_rate=0.1", "workdir": str(tmp_path / "learning_rate=0.1")}
  out = io.StringIO()
  attempt = sweep_local.Attempt(trial, [sys.executable, "-c", "import time; time.sleep(30)"],
                                {"cores": [], "gpus": []}, out)
  attempt.stop()
  attempt.proc.wait(timeout=30)
  assert attempt.finish(out) == sweep_report.PREEMPTED
  assert "[sweep] learning_rate=0.1: stopped before it could save; rerun the sweep to run it (" in out.getvalue()
  assert sweep_report.trial_status(trial["workdir"])["status"] == "unfinished"


def test_the_trial_list_of_a_seed_is_stable_and_covers_the_grid():
  """Optuna's samplers draw the points: these lists are what every rerun (any process, optuna as pinned) gets."""
  discrete = sweep_grid.parse_grid(["a=1,2,3", "b=x,y"])
  assert [t["name"] for t in sweep_grid.trials(discrete)] == [
      "a=1,b=x", "a=1,b=y", "a=2,b=x", "a=2,b=y", "a=3,b=x", "a=3,b=y"]
  assert [t["name"] for t in sweep_grid.trials(discrete, 4, seed=0)] == ["a=3,b=y", "a=2,b=x", "a=1,b=y", "a=2,b=y"]
  every = sweep_grid.trials(discrete, 6, seed=1)
  assert sorted(t["name"] for t in every) == [t["name"] for t in sweep_grid.trials(discrete)]
  ranged = sweep_grid.parse_grid(["lr=loguniform:1e-4:1e-1", "depth=int:1:3", "act=relu,gelu"])
  assert [t["name"] for t in sweep_grid.trials(ranged, 3, seed=7)] == [
      "lr=0.000169,depth=3,act=gelu", "lr=0.0859,depth=2,act=relu", "lr=0.000639,depth=2,act=gelu"]
