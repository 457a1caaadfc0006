"""What a person sees: README's quickstart (digits, a few hundred steps) in a real terminal, tmux's 200 x 50 pane,
read back from the screen: one live bar with evals, saves and warnings printed cleanly above it (never a log line
glued to a bar), none of TensorFlow's own noise, no per-call lines, and a final summary read at a glance. The same
run with its output in a file (a log, SLURM) has one line per call instead, naming every train scalar the run
reports, and no bar."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from loops.callbacks import run_summary
from loops.callbacks import train_log
from tests.conftest import REPO

PY = sys.executable
# 200 steps, an eval and a save every 100: the bar is drawn at step 100 right before the eval's line and the saves'.
RUN = ["main.py", "--config=configs/digits_cnn.py", "--config.train.steps=200", "--config.eval.every_steps=100",
       "--config.checkpoint.every_steps=100", "--config.callbacks=('tests.fixtures.tf_noise:noisy',)"]
LOG_PREFIX = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+")  # absl's and TensorFlow's C++ (I1125 04:39:42.205057)
BAR = re.compile(r"\d+/200 [━─]")


def run_in_tmux(tmp_path, command):
  """Runs `command` (a shell line) in a fresh tmux session of 200 x 50 and returns the whole screen (scrollback
  included, wrapped lines joined) once it has printed its exit code. What the program wrote to the terminal, control
  characters and all, is in tmp_path/raw.log."""
  if not shutil.which("tmux"):
    pytest.skip("tmux is not installed (apt-get install -y tmux): the terminal test reads a real terminal's screen")
  tmux = ["tmux", "-L", f"terminal-test-{uuid.uuid4().hex[:8]}"]  # a server of its own, with this environment
  script = tmp_path / "run.sh"  # as from a user's shell: no TF_CPP_MIN_LOG_LEVEL (conftest sets one)
  script.write_text(f"unset TF_CPP_MIN_LOG_LEVEL TF_CONFIG\ncd {shlex.quote(REPO)}\n{command}\necho EXIT=$?\n")
  subprocess.run([*tmux, "new-session", "-d", "-s", "test", "-x", "200", "-y", "50"], check=True)
  try:
    subprocess.run([*tmux, "pipe-pane", "-t", "test", f"cat >> {shlex.quote(str(tmp_path / 'raw.log'))}"], check=True)
    subprocess.run([*tmux, "send-keys", "-t", "test", f"clear; bash {shlex.quote(str(script))}", "Enter"],
                   check=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
      screen = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-", "-t", "test"], check=True,
                              capture_output=True, text=True).stdout
      if re.search(r"^EXIT=\d+$", screen, re.M):
        return screen
      time.sleep(0.5)
    raise AssertionError(f"no exit code on the screen after 240 s:\n{screen}")
  finally:
    subprocess.run([*tmux, "kill-server"], capture_output=True)


@pytest.mark.e2e
def test_the_quickstart_in_a_terminal_shows_one_bar_clean_lines_and_a_short_summary(tmp_path):
  workdir = tmp_path / "digits"
  screen = run_in_tmux(tmp_path, shlex.join([PY, *RUN, f"--workdir={workdir}"]))
  lines = screen.splitlines()
  assert "EXIT=0" in lines, screen
  assert not [line for line in lines if BAR.search(line) and (LOG_PREFIX.search(line) or "eval at" in line or
                                                                "saved checkpoint" in line)], screen
  assert not [line for line in lines if LOG_PREFIX.search(line)], screen  # plain lines; no TensorFlow C++ chatter
  assert "is deprecated" not in screen and "Instructions for updating" not in screen, screen
  assert "warning: a warning of the user's callback" in lines, screen  # the user's own warnings still show
  assert not [line for line in lines if re.match(r"step \d+/200 \(epoch", line)], screen  # the bar, not lines
  for step in (100, 200):
    assert [line for line in lines if line.startswith(f"eval at step {step}: eval/loss=")], screen
    assert f"saved checkpoint {workdir}/checkpoints/ckpt-{step}" in lines, screen
  [bar] = [line for line in lines if BAR.search(line)]  # the finished bar stays; the ones before were erased
  raw = (tmp_path / "raw.log").read_bytes().decode(errors="replace")  # \r kept
  for step in (50, 100, 150):  # the bar was live: drawn in place after each call...
    assert f"\r\033[K{step:>3}/200 ━" in raw, raw[-3000:]
  eval_line = raw.index("eval at step 100")  # ...and erased before the eval's line was written
  assert raw.rindex("\r\033[K", 0, eval_line) > raw.rindex("100/200 ━", 0, eval_line), raw[-3000:]
  assert bar.startswith("200/200 ━━━━━━━━━━━━━━━━━━━━ ETA 0:00 ") and " - loss: " in bar, bar
  summary = json.load(open(workdir / "summary.json"))
  done = next(i for i, line in enumerate(lines) if line.startswith("done: step=200/200 in "))
  final = lines[done:lines.index("EXIT=0")]
  assert 2 <= len(final) <= 4 and all(len(line) <= 120 for line in final), final
  assert f"accuracy {summary['eval/accuracy']:.4g}," in final[1], final  # eval: loss L, accuracy A, top5_accuracy T
  for key in ("train/loss", "eval/top5_accuracy", "wall_seconds", "examples_per_sec", "checkpoint", "export"):
    assert key in summary, key  # the full record stays in summary.json


@pytest.mark.e2e
def test_output_to_a_file_has_one_line_per_call_with_every_train_scalar_and_no_bar(tmp_path):
  workdir, log = tmp_path / "digits", tmp_path / "run.log"
  user_env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
  with open(log, "w") as output:
    code = subprocess.run([PY, *RUN, f"--workdir={workdir}"], cwd=REPO, env=user_env, stdout=output,
                          stderr=subprocess.STDOUT, timeout=300).returncode
  text = log.read_text()
  assert code == 0, text[-3000:]
  assert not BAR.search(text) and "\r" not in text and "\033[" not in text, text[-3000:]
  assert "is deprecated" not in text and "a warning of the user's callback" in text, text[-3000:]
  assert not re.search(r"^[IWE]0000 00:00", text, re.M), text[-3000:]  # TensorFlow's C++ (absl) lines
  summary = json.load(open(workdir / "summary.json"))
  scalars = [key.split("/", 1)[1] for key in summary if key.startswith("train/")]
  assert "loss" in scalars, summary
  calls = [line for line in text.splitlines() if re.search(r"\] step \d+/200 \(epoch [\d.]+\): ", line)]
  assert len(calls) == 4 and all(LOG_PREFIX.match(line) for line in calls), text[-3000:]  # steps 50..200
  for line in calls:
    assert all(f" {name} " in line for name in scalars) and "images/s, ETA " in line, (line, scalars)
    assert line.count(" took ") <= 1, line  # the epochs a call finished: one mean, not a list
  assert re.search(r", epochs \d+-\d+ took [\d.]+ s each$", calls[-1]), calls[-1]  # 50 steps: 2-3 epochs of 22
  done = [line for line in text.splitlines() if "] done: step=200/200 in " in line]
  assert len(done) == 1 and len(done[0].split("] ", 1)[1]) <= 120, done


def test_the_final_summary_stays_short_with_many_metrics_an_early_stop_and_a_long_path():
  summary = {"step": 300, "total_steps": 1100, "wall_seconds": 75.5, "train_seconds": 61.0, "examples_per_sec": 3150.2,
             "mean_epoch_seconds_excluding_first": 0.5, "best_metric": "eval/accuracy", "best_value": 0.97,
             "best_step": 250, "checkpoint": "/runs/x/checkpoints/ckpt-300", "export": {"keras": "k"},
             "stopped_early": "eval/loss did not improve by more than 0 for 1 evals (best 0.0513 at step 250) " * 2,
             **{f"eval/metric_{i}": i / 7 for i in range(20)}, "eval/accuracy": 0.9722}
  lines = run_summary.short_summary(summary, trained=True, workdir="/runs/x")
  assert len(lines) == 4 and all(len(line) <= 120 for line in lines), lines
  assert lines[0] == ("done: step=300/1100 in 1:16 (training 1:01; after the first call 3150 images/s, 0.50 s per "
                      "epoch)")
  assert lines[1].startswith("stopped early: eval/loss did not improve")
  assert lines[2].startswith("eval: metric_0 0, metric_1 0.1429, ") and lines[2].endswith(" more in summary.json)")
  assert lines[3] == "best: eval/accuracy 0.97 at step 250"
  rerun = run_summary.short_summary({**summary, "stopped_early": None}, trained=False, workdir="/runs/x")
  assert rerun[0] == "done: step=300/1100 (trained before: evaluated again)"
  assert rerun[-1] == "in /runs/x: summary.json, checkpoints/ckpt-300, export/"


def test_a_call_line_names_each_finished_epoch_once():
  assert train_log.epoch_times({}) == ""
  assert train_log.epoch_times({4: 0.07}) == ", epoch 4 took 0.07 s"
  assert train_log.epoch_times({6: 0.08, 5: 0.06}) == ", epochs 5-6 took 0.07 s each"
