"""A user's code branches and loops in Python on tensors (AutoGraph converts it) wherever the framework calls it:
its loss function, a task's loss, gradient transform, train step and eval step. The framework's own step functions
and helpers are not converted (tf.autograph.experimental.do_not_convert: converting them cost about 1 s of every
run's start); they call the task through loops/task's user_call, which converts it, or such code fails in the step
with "using a tf.Tensor as a Python bool"."""

import os
import subprocess
import sys

import pytest

from loops import run
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # trains models (pytest.ini)

PLUGINS = os.path.join(REPO, "tests", "fixtures", "plugins")


@pytest.fixture(autouse=True)
def plugins_importable(monkeypatch):
  monkeypatch.setattr(sys, "path", [PLUGINS, *sys.path])


def test_a_loss_function_branching_on_a_tensor_trains(tiny_digits, tmp_path):
  tiny_digits.loss.name = "branching:capped_cross_entropy"
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path))
  assert summary["step"] == 20 and 0.0 < summary["train/loss"] < 2.5
  assert summary["eval/accuracy"] > 0.2


def test_a_task_branching_and_looping_on_tensors_trains_on_two_replicas(tiny_digits, tmp_path):
  tiny_digits.task.name = "branching:Branching"
  tiny_digits.strategy = "mirrored"
  tiny_digits.cpu_replicas = 2
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path))
  assert summary["step"] == 20 and summary["train/repeats"] == pytest.approx(2.0)
  assert 0.0 <= summary["train/clipped"] <= 1.0 and 0.0 < summary["train/loss"] < 2.5
  assert summary["eval/accuracy"] > 0.2


def test_a_train_step_branching_on_a_tensor_trains(tiny_digits, tmp_path):
  tiny_digits.task.name = "branching:StepBranching"
  summary = run.train_and_evaluate(tiny_digits, str(tmp_path))
  assert summary["step"] == 20 and summary["train/repeats"] == pytest.approx(2.0)
  assert 0.0 < summary["train/loss"] < 2.5 and summary["eval/accuracy"] > 0.2


# A fresh process (AutoGraph caches conversions per process) runs main.py, then names what AutoGraph converted: each
# conversion is a module of generated code (`def tf__<name>`) in sys.modules until the process exits.
CONVERTED = """
import re, runpy, sys
sys.argv = ["main.py", *sys.argv[1:]]
try:
  runpy.run_path("main.py", run_name="__main__")
except SystemExit as e:
  if e.code:
    raise
names = [re.search(r"def tf__(\\w+)\\(", open(module.__file__).read()).group(1)
         for name, module in list(sys.modules.items()) if name.startswith("__autograph_generated_file")]
print("converted:", " ".join(sorted(names)))
"""


def test_a_run_converts_only_the_user_call_trampoline_and_the_saved_models_signatures(tmp_path):
  """The framework's own code is not converted (its loops, steps, built-in task and losses: 0.6 s of a digits
  run's start here); user_call's trampoline is, and Keras' and TensorFlow's SavedModel signatures."""
  done = subprocess.run([sys.executable, "-c", CONVERTED, "--config=configs/digits_cnn.py", "--config.train.steps=20",
                         f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.splitlines()[-1] == "converted: _calling serving_default signature_wrapper", done.stdout[-500:]
