"""WORKSPACE.md's module counts, measured: a short digits run of main.py in a fresh process (compiled functions run
eagerly, so every Python frame shows) records the project modules on the Python stack whenever a gradient is
taken, an eval metric is updated and a checkpoint is saved; each count is the number of distinct modules over
every such moment of the run, which the sentence in "The path of a run" must state."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

SENTENCE = re.compile(r"From `?main\.py`?, a train step passes through (\d+) modules, an eval through (\d+), "
                      r"a save through (\d+)")
WHAT = ("a train step", "an eval", "a save")

# Run as `python -c RECORDER OUT ARGS...` from the repository: main.py with ARGS, the stacks written to OUT.
RECORDER = r'''
import json, os, runpy, sys, traceback
sys.path.insert(0, os.getcwd())
import keras
import tensorflow as tf

OURS = ("main.py", "loops/", "data/", "models/", "configs/")
out, stacks = sys.argv[1], {"a train step": [], "an eval": [], "a save": []}
tf.config.run_functions_eagerly(True)


def recording(cls, name, what):
  original = getattr(cls, name)

  def recorded(*args, **kwargs):
    files = (os.path.relpath(frame.filename).replace(os.sep, "/") for frame in traceback.extract_stack())
    stacks[what].append(sorted({f for f in files if f.startswith(OURS)}))
    return original(*args, **kwargs)

  setattr(cls, name, recorded)


recording(tf.GradientTape, "gradient", "a train step")
recording(keras.metrics.Mean, "update_state", "an eval")
recording(tf.train.CheckpointManager, "save", "a save")
sys.argv = ["main.py", *sys.argv[2:]]
try:
  runpy.run_path("main.py", run_name="__main__")
finally:
  with open(out, "w") as f:
    json.dump(stacks, f)
'''


def measured_modules(workdir):
  """{what: sorted project modules on the stack at any of its moments} of a 5-step digits run with an eval and a
  checkpoint every 2 steps."""
  out = os.path.join(workdir, "stacks.json")
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  done = subprocess.run(
      [sys.executable, "-c", RECORDER, out, "--config=configs/digits_cnn.py", f"--workdir={workdir}/run",
       "--config.train.epochs=0.2", "--config.train.steps_per_loop=2", "--config.eval.every_steps=2",
       "--config.checkpoint.every_steps=2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out) as f:
    stacks = json.load(f)
  return {what: sorted({module for stack in stacks[what] for module in stack}) for what in WHAT}


def stated_counts(text):
  """{what: the count WORKSPACE.md states}, or None when the sentence is missing."""
  found = SENTENCE.search(" ".join(text.split()))
  return dict(zip(WHAT, map(int, found.groups()))) if found else None


def test_the_sentence_is_read_and_a_missing_one_is_noticed():
  assert stated_counts("From main.py, a train step passes through 5 modules, an eval through\n 6, a save through "
                       "4.") == {"a train step": 5, "an eval": 6, "a save": 4}
  assert stated_counts("Following one piece of work through the code takes at most four modules") is None


@pytest.mark.e2e  # trains a model in a process of its own (pytest.ini)
def test_workspace_states_the_module_counts_a_run_measures(tmp_path):
  with open(os.path.join(REPO, "WORKSPACE.md")) as f:
    stated = stated_counts(f.read())
  assert stated, f"WORKSPACE.md lacks the sentence {SENTENCE.pattern!r} in 'The path of a run'"
  modules = measured_modules(str(tmp_path))
  for what in WHAT:
    assert modules[what], f"the run never reached {what}"
  measured = {what: len(modules[what]) for what in WHAT}
  assert measured == stated, f"WORKSPACE.md states {stated}, the run measures {modules}"
