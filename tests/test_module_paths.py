"""WORKSPACE.md's module counts, measured as a newcomer counts them: a short digits run of main.py in a fresh process
(compiled functions run eagerly, so every Python frame shows) records, whenever gradients are applied, an eval
metric is updated and a checkpoint is saved, the project modules on the Python stack and every project module whose
code ran since the loop (loops/core/loop.py) handed over to the next module on that stack. Each count is the number
of distinct modules over every such moment of the run, which the sentence in "The path of a run" must state.

The same run follows the settings from loops/run.py's train_and_evaluate: every call of a project function given the
config bag, a group of it (a ConfigDict) or a configs/settings.py section; consecutive calls in one module are one
stay, a stay in a module visited before is a return. WORKSPACE's "Settings" section must state those numbers."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

SENTENCE = re.compile(r"From `?main\.py`?, following a train step opens (\d+) modules, an eval (\d+), a save (\d+)"
                      r".*?The modules on the stack alone: (\d+), (\d+) and (\d+)\.")
WHAT = ("a train step", "an eval", "a save")
WALK = re.compile(r"Followed from `?train_and_evaluate`?, the settings make (\d+) stays in (\d+) modules \((\d+) "
                  r"returns")

# Run as `python -c RECORDER OUT ARGS...` from the repository: main.py with ARGS, the modules written to OUT.
RECORDER = r"""
import functools, itertools, json, os, runpy, sys
sys.path.insert(0, os.getcwd())
import keras
import ml_collections
import tensorflow as tf

OURS = ("main.py", "errors.py", "loops/", "data/", "models/", "configs/")
out = sys.argv[1]
seen = {what: {"opened": set(), "stack": set()} for what in ("a train step", "an eval", "a save")}
tf.config.run_functions_eagerly(True)
sequence, entered, calls = itertools.count(), {}, []  # entered: id(frame) -> its call's number
walk = []  # from train_and_evaluate on: the module of each call given the bag, a group of it or a settings section


@functools.lru_cache(maxsize=None)  # the profile sees every Python call: its file's answer is computed once
def ours(filename):
  name = os.path.relpath(filename).replace(os.sep, "/")
  return name if name.startswith(OURS) else None


def source_of(frame):  # AutoGraph's conversion of our code (the task: user_call) runs in its module's globals
  filename = frame.f_code.co_filename
  if os.path.basename(filename).startswith("__autograph_generated_file"):
    filename = frame.f_globals.get("__file__") or filename
  return ours(filename)


def carries_settings(value):
  return isinstance(value, ml_collections.ConfigDict) or type(value).__module__ == "configs.settings"


def profile(frame, event, arg):
  if event == "call":
    entered[id(frame)] = number = next(sequence)
    module, code = source_of(frame), frame.f_code
    if module:
      calls.append((number, module))
      if walk or (module, code.co_name) == ("loops/run.py", "train_and_evaluate"):
        given = [frame.f_locals.get(name) for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
        if not walk or any(carries_settings(value) for value in given):
          walk.append(module)


def moment(what):
  frames, frame = [], sys._getframe(2)
  while frame is not None:
    frames.append(frame)
    frame = frame.f_back
  frames.reverse()
  modules = [source_of(f) for f in frames]
  handed = max(i for i, module in enumerate(modules) if module == "loops/core/loop.py") + 1
  since = entered.get(id(frames[handed]), 0)
  seen[what]["stack"] |= {m for m in modules if m}
  seen[what]["opened"] |= seen[what]["stack"] | {module for number, module in calls if number >= since}


def recording(cls, name, what):
  original = getattr(cls, name)

  def recorded(*args, **kwargs):
    moment(what)
    return original(*args, **kwargs)

  setattr(cls, name, recorded)


recording(keras.optimizers.Optimizer, "apply_gradients", "a train step")
recording(keras.metrics.Mean, "update_state", "an eval")
recording(tf.train.CheckpointManager, "save", "a save")
sys.argv = ["main.py", *sys.argv[2:]]
sys.setprofile(profile)
try:
  runpy.run_path("main.py", run_name="__main__")
finally:
  sys.setprofile(None)
  stays = [module for i, module in enumerate(walk) if i == 0 or walk[i - 1] != module]
  with open(out, "w") as f:
    json.dump({**{what: {kind: sorted(found) for kind, found in kinds.items()} for what, kinds in seen.items()},
               "the settings": {"stays": len(stays), "modules": len(set(stays)),
                                "returns": sum(module in stays[:i] for i, module in enumerate(stays))}}, f)
"""


def measured_modules(workdir):
  """{what: the project modules a newcomer opens to follow it} of a 5-step digits run with an eval and a checkpoint
  every 2 steps, over every moment of the run."""
  out = os.path.join(workdir, "modules.json")
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  done = subprocess.run(
      [sys.executable, "-c", RECORDER, out, "--config=configs/digits_cnn.py", f"--workdir={workdir}/run",
       "--config.train.epochs=0.2", "--config.train.steps_per_loop=2", "--config.eval.every_steps=2",
       "--config.checkpoint.every_steps=2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out) as f:
    return json.load(f)


def stated_counts(text):
  """{what: (modules opened, modules on the stack)} as WORKSPACE.md states them, or None without the sentence."""
  found = SENTENCE.search(" ".join(text.split()))
  return {what: (int(found.group(i + 1)), int(found.group(i + 4))) for i, what in enumerate(WHAT)} if found else None


def test_the_sentence_is_read_and_a_missing_one_is_noticed():
  assert stated_counts("From main.py, following a train step opens 9 modules, an eval\n 8, a save 7 (how). The "
                       "modules on the stack alone: 5, 6 and 4.") == {
      "a train step": (9, 5), "an eval": (8, 6), "a save": (7, 4)}
  assert stated_counts("Following one piece of work through the code takes at most four modules") is None


@pytest.mark.e2e  # trains a model in a process of its own (pytest.ini)
def test_workspace_states_the_module_counts_a_run_measures(tmp_path):
  with open(os.path.join(REPO, "WORKSPACE.md")) as f:
    text = f.read()
  stated = stated_counts(text)
  assert stated, f"WORKSPACE.md lacks the sentence {SENTENCE.pattern!r} in 'The path of a run'"
  modules = measured_modules(str(tmp_path))
  for what in WHAT:
    assert set(modules[what]["stack"]) >= {"main.py", "loops/run.py", "loops/core/loop.py"}, (what, modules[what])
    assert set(modules[what]["opened"]) >= set(modules[what]["stack"])
  measured = {what: (len(modules[what]["opened"]), len(modules[what]["stack"])) for what in WHAT}
  assert measured == stated, f"WORKSPACE.md states {stated}, the run measures {modules}"
  walk = WALK.search(" ".join(text.split()))
  assert walk, f"WORKSPACE.md lacks the sentence {WALK.pattern!r} in 'Settings'"
  followed = modules["the settings"]
  assert followed["stays"] >= followed["modules"] >= 10 and followed["returns"] < followed["stays"], followed
  assert tuple(map(int, walk.groups())) == (followed["stays"], followed["modules"], followed["returns"]), (
      f"WORKSPACE.md states {walk.groups()}, the run measures {followed}")
