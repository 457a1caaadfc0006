import glob
import os

import pytest

from configs import base
from tests.conftest import REPO, load_config

SHIPPED = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
                 if not p.endswith(("__init__.py", "base.py", "settings.py")))  # settings.py: read once from base


def test_shipped_configs_are_the_expected_set():
  for name in ("digits_cnn", "mnist_cnn", "resnet50_mirrored", "resnet152_mirrored", "quickdraw_cnn"):
    assert name in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_config_has_only_base_keys_and_documents_its_command(name):
  import importlib
  module = importlib.import_module(f"configs.{name}")
  assert f"python main.py --config=configs/{name}.py" in module.__doc__
  assert "Expected" in module.__doc__
  config, defaults = module.get_config(), base.get_config()

  def keys(c, prefix=""):
    out = set()
    for k, v in c.items():
      out |= keys(v, f"{prefix}{k}.") if hasattr(v, "items") and k != "kwargs" else {prefix + k}
    return out

  assert keys(config) == keys(defaults)
  if name == "tasks":  # its argument names an example (their data is always here)
    assert load_config(name, "gan").task.name == "examples.tasks.gan:DigitsGan"
    with pytest.raises(ValueError, match="configs/tasks.py:<name> takes one of regression, gan, "):
      load_config(name, "synthetic")
  else:
    assert load_config(name, "synthetic").data.name == "synthetic"


def test_parse_arg_accepts_known_keys_and_types():
  parsed = base.parse_arg("synthetic,steps=7,lr=0.5", synthetic=False, steps=1, lr=0.1)
  assert parsed.synthetic is True and parsed.steps == 7 and parsed.lr == 0.5
  assert base.parse_arg(None, synthetic=False).synthetic is False


@pytest.mark.parametrize("arg, message", [
    ("bogus", "unknown config argument 'bogus'; valid arguments: steps, synthetic"),
    ("steps=x", "config argument 'steps' takes a int, got 'x'"),
    ("steps", "config argument 'steps' needs a value"),
    ("synthetic=maybe", "config argument 'synthetic' takes true/false"),
])
def test_parse_arg_rejects_bad_arguments(arg, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    base.parse_arg(arg, synthetic=False, steps=1)


def test_task_configs_derive_their_eval_and_checkpoint_cadence_from_the_steps_given_on_the_command_line():
  from tests.conftest import load_config
  config = load_config("tasks", "gan")
  assert config.eval.every_steps == config.checkpoint.every_steps == config.train.steps // 2
  config.train.steps = 5000  # as --config.train.steps=5000 sets it
  assert config.eval.every_steps == config.checkpoint.every_steps == 2500
  config.eval.every_steps = 40  # an explicit cadence still wins
  assert config.eval.every_steps == 40 and config.checkpoint.every_steps == 2500
