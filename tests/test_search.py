"""launch.sweep with an Optuna study: TPE + ASHA on digits (8 trials, 2 at a time; interrupted with SIGINT and rerun),
the SLURM array script's tasks sharing one study, refusals of a changed space or metric; and a trial counts complete
only when its own summary proves the current settings (issue 35's sweep reruns)."""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import sweep_grid
from launch import sweep_report
from launch import sweep_study
from loops.callbacks import sweep_trial
from tests.conftest import REPO, ctrl_c_reaches_it

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

STEPS = 150
SPACE = ["--grid", "optimizer.learning_rate=loguniform:1e-3:1"]
TPE = [*SPACE, "--search=tpe", "--trials", "8", "--prune=asha", "--parallel", "2", "--seed", "0"]
EXTRA = ["--", f"--config.train.steps={STEPS}", "--config.train.steps_per_loop=30", "--config.eval.every_steps=30",
         "--config.checkpoint.every_steps=30", "--config.export=False"]


def command(sweep_dir, *args):
  return [sys.executable, "-m", "launch.sweep", "--config=configs/digits_cnn.py", f"--sweep_dir={sweep_dir}", *args]


def sweep(sweep_dir, *args, env=None):
  return subprocess.run(command(sweep_dir, *args), cwd=REPO, capture_output=True, text=True, timeout=600,
                        env={**os.environ, **(env or {})})


def study_trials(sweep_dir):
  return sweep_trial.load_study(os.path.join(sweep_dir, sweep_study.STUDY_FILE)).get_trials()


def workdir_files(sweep_dir):
  """{trial name: (summary.json's bytes or None, starts.jsonl's lines)} of every trial workdir."""
  files = {}
  for name in os.listdir(sweep_dir):
    workdir = os.path.join(sweep_dir, name)
    if not os.path.exists(os.path.join(workdir, "sweep.json")):
      continue
    summary = os.path.join(workdir, "summary.json")
    starts = os.path.join(workdir, "starts.jsonl")
    files[name] = (open(summary, "rb").read() if os.path.exists(summary) else None,
                   open(starts).read().splitlines() if os.path.exists(starts) else [])
  return files


def training(sweep_dir):
  """A trial has started training (starts.jsonl) and not ended (no summary.json)."""
  return any(os.path.exists(os.path.join(sweep_dir, name, "starts.jsonl"))
             and not os.path.exists(os.path.join(sweep_dir, name, "summary.json")) for name in os.listdir(sweep_dir))


@pytest.fixture(scope="module")
def tpe(tmp_path_factory):
  """The TPE + ASHA sweep: stopped by SIGINT once two trials have ended, then the same command again."""
  sweep_dir = str(tmp_path_factory.mktemp("search"))
  proc = subprocess.Popen(command(sweep_dir, *TPE, *EXTRA), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_reaches_it)
  lines, ended = [], 0
  for line in proc.stdout:
    lines.append(line)
    ended += line.startswith("[sweep] learning_rate=")
    if ended == 2:
      break
  deadline = time.monotonic() + 120
  while not training(sweep_dir) and time.monotonic() < deadline:  # Ctrl-C while a later trial trains
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  lines += proc.stdout.readlines()
  first = (proc.wait(timeout=300), "".join(lines))
  interrupted = {"files": workdir_files(sweep_dir), "states": {t.number: t.state.name for t in study_trials(sweep_dir)}}
  second = sweep(sweep_dir, *TPE, *EXTRA)
  with open(os.path.join(sweep_dir, "report.csv")) as f:
    rows = list(csv.DictReader(f))
  return {"dir": sweep_dir, "first": first, "interrupted": interrupted, "second": second, "rows": rows}


def test_tpe_asha_prunes_early_spends_fewer_steps_and_finds_a_good_rate(tpe):
  second = tpe["second"]
  assert second.returncode == 0, second.stdout + second.stderr
  summaries = {row["trial"]: json.load(open(os.path.join(tpe["dir"], row["trial"], "summary.json")))
               for row in tpe["rows"]}
  assert len(summaries) == 8
  pruned = {name: s for name, s in summaries.items() if "pruned" in s}
  assert len(pruned) >= 2
  for summary in pruned.values():
    step, value = summary["pruned"]["step"], summary["pruned"]["value"]
    assert step < STEPS and summary["step"] == step and step % 30 == 0
    assert summary["stopped_early"] == f"pruned at step {step} (value {value:.4g})"
    assert summary["eval/accuracy"] == pytest.approx(value)
  spent = sum(s["step"] for s in summaries.values())
  assert spent < 8 * STEPS and all(s["total_steps"] == STEPS for s in summaries.values())
  assert max(float(row["best eval/accuracy"]) for row in tpe["rows"]) >= 0.95  # the best eval of the best trial
  # the report: state, step reached, the steps spent against 8 full-length trials, the PNG
  rows = {row["trial"]: row for row in tpe["rows"]}
  for name, summary in summaries.items():
    assert rows[name]["status"] == ("pruned" if name in pruned else "complete") and rows[name]["step"] == str(
        summary["step"])
    assert rows[name]["stopped"] == summary.get("stopped_early", "")
  markdown = open(os.path.join(tpe["dir"], "report.md")).read()
  assert (f"8 trials: {8 - len(pruned)} complete, {len(pruned)} pruned; steps spent {spent} of {8 * STEPS} for 8 "
          f"full-length trials ({100 * spent / (8 * STEPS):.0f} %)") in markdown
  with open(os.path.join(tpe["dir"], "best_by_trial.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # the study: 8 trials, each told how it ended; values = the trials' best
  trials = study_trials(tpe["dir"])
  assert sorted(t.user_attrs["index"] for t in trials) == list(range(8))
  for trial in trials:
    summary = summaries[trial.user_attrs["name"]]
    assert summary["sweep_trial"] == trial.number
    assert trial.state.name == ("PRUNED" if "pruned" in summary else "COMPLETE")
    if trial.state.name == "COMPLETE":
      assert trial.value == pytest.approx(max(trial.intermediate_values.values()))
    assert set(trial.intermediate_values) <= set(range(30, STEPS + 1, 30)) and summary["step"] in (
        trial.intermediate_values)  # every eval reported (one may fall between a preemption save and its resume)


def test_an_interrupted_study_sweep_continues_without_repeating_trials(tpe):
  code, output = tpe["first"]
  assert code == 143, output
  assert "[sweep] stopping: SIGTERM to" in output
  before = tpe["interrupted"]
  ended = {name for name, (summary, _) in before["files"].items()
           if summary and sweep_report.is_complete(os.path.join(tpe["dir"], name))}
  assert len(ended) >= 2 and len(before["states"]) < 8
  # its report counts the trials the study has not asked yet (it said "N trials" of the asked ones, and their %)
  assert "\n8 trials: " in output and f", {8 - len(before['states'])} not asked yet; steps " \
      "spent " in output, output
  second = tpe["second"].stdout
  assert f"8 trials, {len(ended)} complete (skipped), {8 - len(ended)} to run" in second
  after = workdir_files(tpe["dir"])
  for name in ended:  # not started again: the same summary, one start
    assert after[name] == before["files"][name] and len(after[name][1]) == 1
    assert f"start {name} " not in second
  resumed = [name for name, (summary, starts) in before["files"].items() if name not in ended and starts]
  assert resumed  # stopped while training
  for name in resumed:  # the same Optuna trial goes on in the same workdir, from its checkpoint
    assert len(after[name][1]) == 2 and json.loads(after[name][1][1])["step"] % 30 == 0
    assert f"start {name} " in second
  numbers = [t.number for t in study_trials(tpe["dir"])]
  assert numbers == list(range(8))  # no trial asked twice, none failed
  for number, state in before["states"].items():
    if state in ("COMPLETE", "PRUNED"):
      assert study_trials(tpe["dir"])[number].state.name == state


def test_a_changed_space_or_metric_is_refused_with_one_line(tpe):
  narrower = sweep(tpe["dir"], "--grid", "optimizer.learning_rate=loguniform:1e-2:1", *TPE[2:], *EXTRA)
  lines = narrower.stderr.strip().splitlines()
  assert narrower.returncode == 1 and len(lines) == 1, narrower.stderr
  assert lines[0].startswith("error: the sweep's study") and "has space" in lines[0] and "loguniform:0.01:1" in lines[0]
  metric = sweep(tpe["dir"], *TPE, *EXTRA, "--config.checkpoint.best_metric=eval/loss",
                 "--config.checkpoint.best_mode=min")
  lines = metric.stderr.strip().splitlines()
  assert metric.returncode == 1 and len(lines) == 1
  assert "has metric 'eval/accuracy', this command 'eval/loss'" in lines[0]
  assert len(study_trials(tpe["dir"])) == 8 and json.load(open(os.path.join(tpe["dir"], "trials.json")))[
      "extra_args"] == EXTRA[1:]  # nothing overwritten


def test_hparams_lists_pruned_trials_too(tpe):
  from tensorboard.backend.event_processing import plugin_event_multiplexer
  from tensorboard.plugins.hparams import metadata

  multiplexer = plugin_event_multiplexer.EventMultiplexer()
  multiplexer.AddRunsFromDirectory(tpe["dir"])
  multiplexer.Reload()
  content = multiplexer.PluginRunToTagToContent(metadata.PLUGIN_NAME)
  sessions = {run for run, tags in content.items() if metadata.SESSION_START_INFO_TAG in tags}
  assert sessions == {row["trial"] for row in tpe["rows"]}
  assert {row["status"] for row in tpe["rows"]} == {"complete", "pruned"}
  experiment = metadata.parse_experiment_plugin_data(content["."][metadata.EXPERIMENT_TAG])
  assert experiment.hparam_infos[0].name == "optimizer.learning_rate"
  assert experiment.hparam_infos[0].domain_interval.min_value == pytest.approx(1e-3)


def test_slurm_array_tasks_share_the_study(tmp_path):
  sweep_dir = str(tmp_path / "array")
  extra = ["--", "--config.train.steps=40", "--config.train.steps_per_loop=20", "--config.eval.every_steps=20",
           "--config.export=False"]
  written = sweep(sweep_dir, *SPACE, "--search=tpe", "--trials", "2", "--prune=asha", "--slurm", *extra)
  assert written.returncode == 0, written.stderr
  script = os.path.join(sweep_dir, "sweep.sbatch")
  assert "#SBATCH --array=0-1\n" in open(script).read()

  def task(task_id):
    return subprocess.Popen(["bash", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            env={**os.environ, "SLURM_ARRAY_TASK_ID": str(task_id), "SLURM_ARRAY_JOB_ID": "500",
                                 "SLURM_JOB_ID": str(501 + task_id)})

  tasks = [task(0), task(1)]  # at the same time, as an array's tasks start
  outputs = [t.communicate(timeout=300) for t in tasks]
  assert [t.returncode for t in tasks] == [0, 0], outputs
  trials = study_trials(sweep_dir)
  assert sorted(t.user_attrs["index"] for t in trials) == [0, 1] and len(trials) == 2
  assert all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
  for trial in trials:
    summary = json.load(open(os.path.join(sweep_dir, trial.user_attrs["name"], "summary.json")))
    assert summary["sweep_trial"] == trial.number and sorted(trial.intermediate_values) == list(
        range(20, summary["step"] + 1, 20))
  again = task(1)  # a requeued or rerun task finds its trial, complete: nothing run, nothing asked
  _, err = again.communicate(timeout=120)
  assert again.returncode == 0 and "is complete" in err and len(study_trials(sweep_dir)) == 2
  report = sweep(sweep_dir, "--report")
  assert report.returncode == 0 and report.stdout.count("| learning_rate=") == 2 and "2 trials:" in report.stdout


def test_changed_flags_that_the_resume_refuses_leave_the_trial_failed_not_complete(tmp_path):
  """Issue 35: a rerun with a changed setting after -- that each trial's resume refuses showed the trials complete
  with the old metrics, and the next rerun skipped them."""
  sweep_dir = str(tmp_path / "changed")
  short = ["--", "--config.train.steps=20", "--config.train.steps_per_loop=20", "--config.export=False"]
  first = sweep(sweep_dir, "--grid", "optimizer.learning_rate=0.1", *short)
  assert first.returncode == 0, first.stdout + first.stderr
  changed = sweep(sweep_dir, "--grid", "optimizer.learning_rate=0.1", *short, "--config.train.global_batch_size=32")
  assert changed.returncode == 1 and "learning_rate=0.1: failed: error: " in changed.stdout, changed.stdout
  with open(os.path.join(sweep_dir, "report.csv")) as f:
    row = next(csv.DictReader(f))
  assert row["status"] == "failed" and "global_batch_size" in row["error"]
  again = sweep(sweep_dir, "--grid", "optimizer.learning_rate=0.1", *short, "--config.train.global_batch_size=32")
  assert "1 trials, 0 complete (skipped), 1 to run" in again.stdout and again.returncode == 1


def test_a_summary_counts_only_for_the_settings_it_ran(tmp_path):
  """Issue 35: a rerun with changed extra flags, itself interrupted, treated old-length trials as complete."""
  workdir = tmp_path / "trial"
  workdir.mkdir()
  summary = {"step": 100, "total_steps": 100, "sweep_settings": "old"}
  (workdir / "summary.json").write_text(json.dumps(summary))
  assert sweep_report.is_complete(str(workdir), "old") and not sweep_report.is_complete(str(workdir), "new")
  assert sweep_report.trial_status(str(workdir), "new")["status"] == "pending"  # never started with "new"
  from launch import sweep_local
  one = sweep_local.settings_of("c.py", {"a": "1"}, ["--config.train.steps=100"])
  assert one != sweep_local.settings_of("c.py", {"a": "1"}, ["--config.train.steps=200"])
  assert one == sweep_local.settings_of("c.py", {"a": "1"}, ["--config.train.steps=100"])


def test_study_trials_are_assigned_once_and_a_failed_one_again_with_its_values(tmp_path):
  record = {"space": {"lr": "loguniform:0.001:1"}, "metric": "eval/accuracy", "mode": "max", "search": "grid",
            "prune": "asha", "seed": 0, "trials": 2}
  study = sweep_study.open_study(str(tmp_path / "study.log"), record)
  space = sweep_grid.parse_grid(["lr=loguniform:1e-3:1"])
  first = sweep_study.assign(study, str(tmp_path), 0, space, {"lr": "0.1"})
  assert first["overrides"] == {"lr": "0.1"} and first["name"] == "lr=0.1" and first["number"] == 0
  assert sweep_study.assign(study, str(tmp_path), 0, None, {"lr": "0.5"})["number"] == 0  # found, not asked again
  sweep_study.fail(study, 0)
  again = sweep_study.assign(study, str(tmp_path), 0, None, None)
  assert again["number"] == 1 and again["overrides"] == {"lr": "0.1"} and again["workdir"] == first["workdir"]
  assert [t["number"] for t in sweep_study.known(study, str(tmp_path))] == [1]
  tpe_record = {**record, "search": "tpe"}
  with pytest.raises(sweep_grid.SweepError, match="has search 'grid', this command 'tpe'"):
    sweep_study.open_study(str(tmp_path / "study.log"), tpe_record)
  grid = sweep_grid.parse_grid(["lr=loguniform:1e-3:1", "depth=int:1:3", "act=relu,gelu"])
  space = sweep_study.distributions(grid)
  assert space["lr"].log and (space["lr"].low, space["lr"].high) == (1e-3, 1)
  assert (space["depth"].low, space["depth"].high) == (1, 3) and space["act"].choices == ("relu", "gelu")
  pruners = {kind: type(sweep_trial.make_pruner(kind, 20, 100)).__name__ for kind in sweep_study.PRUNERS}
  assert pruners == {"none": "NopPruner", "asha": "SuccessiveHalvingPruner", "hyperband": "HyperbandPruner"}


def test_bad_search_flags_are_one_line(tmp_path):
  for args, message in [(["--search=tpe"], "--search=tpe needs --trials N"),
                        (["--trials", "3"], "--trials is for --search=random|tpe"),
                        (["--search=random", "--trials", "0"], "--search=random needs --trials N with N >= 1 (got 0)"),
                        (["--search=tpe", "--random", "3"], "--random N is --search=random --trials N")]:
    done = sweep(tmp_path / "bad", *SPACE, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), done.stderr
  assert not (tmp_path / "bad").exists()


def test_a_pruned_trial_stays_pruned_when_rerun_with_a_longer_length(tmp_path):
  """A rerun of a sweep whose length grew starts every trial again: a pruned one stops at once, not trained on."""
  import optuna
  from configs import base
  from configs import settings
  from loops.core.loop import State

  record = {"space": {"lr": "0.1"}, "metric": "eval/accuracy", "mode": "max", "search": "grid", "prune": "asha",
            "seed": 0, "trials": 1}
  study = sweep_study.open_study(str(tmp_path / "study.log"), record)
  trial = study.ask()
  trial.report(0.25, 30)
  study.tell(trial, state=optuna.trial.TrialState.PRUNED)
  config = base.get_config()
  config.sweep.study, config.sweep.trial, config.sweep.settings = str(tmp_path / "study.log"), 0, "new"
  read = settings.read(config)
  callback = sweep_trial.SweepTrial(read.sweep, read.checkpoint, read.eval)
  state = State(step=30, total_steps=600, steps_per_epoch=10, is_chief=True, workdir=str(tmp_path), writer=None)
  callback.on_train_begin(state)
  assert state.stop_reason == "pruned at step 30 (value 0.25)" and callback.trial is None
  callback.on_train_end(state)
  assert state.summary["pruned"] == {"step": 30, "value": 0.25} and state.summary["sweep_settings"] == "new"
  assert study.get_trials()[0].state.name == "PRUNED"


def test_a_ctrl_c_while_a_trial_is_asked_acts_once_the_trial_is_recorded(tmp_path, monkeypatch):
  """Ctrl-C between Optuna's ask and the trial's attributes left a RUNNING trial that no rerun found (9 trials where
  8 were asked: found when forked trials started faster)."""
  import optuna
  record = {"space": {"lr": "loguniform:0.001:1"}, "metric": "eval/accuracy", "mode": "max", "search": "tpe",
            "prune": "none", "seed": 0, "trials": 2}
  study = sweep_study.open_study(str(tmp_path / "study.log"), record)
  ask = optuna.Study.ask

  def interrupted_ask(self, *args, **kwargs):
    trial = ask(self, *args, **kwargs)
    signal.raise_signal(signal.SIGINT)  # a Ctrl-C right after the ask
    return trial

  monkeypatch.setattr(optuna.Study, "ask", interrupted_ask)
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever runs the suite
  try:
    with pytest.raises(KeyboardInterrupt):
      sweep_study.assign(study, str(tmp_path), 0, sweep_grid.parse_grid(["lr=loguniform:1e-3:1"]))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, previous)
  [trial] = study.get_trials()
  assert trial.user_attrs["index"] == 0 and trial.user_attrs["name"].startswith("lr=") and "lr" in trial.params
  # the run is given the value the study records (it trained 0.0157 where Optuna kept 0.015676677...)
  assert float(trial.user_attrs["overrides"]["lr"]) == trial.params["lr"]
  assert trial.user_attrs["name"] == f"lr={trial.params['lr']:.3g}"


def test_a_study_sweeps_report_lists_a_trial_asked_but_not_started(tmp_path, monkeypatch):
  """The study asked a 4th trial as a Ctrl-C came, before it started: the report listed the 3 started and said 5
  not asked yet where the study held 4 (CI of c740759)."""
  from launch import sweep as sweep_lib
  from launch import sweep_local
  monkeypatch.setattr(sweep_lib, "dry_run", lambda config, trial, extra: ("eval/accuracy", "max", {}))

  def interrupted_run(config, trials, extra_args, parallel, out, more=None, on_end=None):
    _, ask = more
    trials.append(ask(0))  # started (it writes nothing here: pending too)
    ask(1)  # asked as the Ctrl-C came, never started
    return sweep_report.PREEMPTED

  monkeypatch.setattr(sweep_local, "run", interrupted_run)
  out = io.StringIO()
  code = sweep_lib.main(["--config=configs/digits_cnn.py", f"--sweep_dir={tmp_path}", *SPACE, "--search=tpe",
                         "--trials", "4", "--seed", "0"], out=out)
  assert code == sweep_report.PREEMPTED and len(study_trials(str(tmp_path))) == 2
  assert "\n4 trials: 2 pending, 2 not asked yet" in out.getvalue(), out.getvalue()
