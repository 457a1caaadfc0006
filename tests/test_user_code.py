"""User code in the user's own folder (data/user_code.py): plug-ins by file path as well as by module, and a user
package named like the framework's (`models`) said in one line with the form that reaches it."""

import json
import os
import sys
import textwrap

import pytest

from data import user_code
from errors import ConfigError
from tests.conftest import REPO, pythonpath, run_command

NET = textwrap.dedent("""
    import keras
    import blocks  # a module beside this file

    def make(input_shape, num_classes):
      return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), blocks.hidden(),
                               keras.layers.Dense(num_classes)], name="mynet")
    """)


@pytest.fixture
def users_repository(tmp_path):
  """A researcher's repository with its own models/ package (models/mynet.py, models/blocks.py)."""
  (tmp_path / "models").mkdir()
  (tmp_path / "models" / "__init__.py").write_text("")
  (tmp_path / "models" / "mynet.py").write_text(NET)
  (tmp_path / "models" / "blocks.py").write_text("import keras\n\ndef hidden():\n  return keras.layers.Dense(16, "
                                                 "activation='relu')\n")
  (tmp_path / "mydata.py").write_text("import numpy as np\n\ndef arrays(split):\n  n = 64 if split == 'train' else "
                                      "16\n  return np.ones((n, 3), np.float32), np.zeros((n,), np.int64)\n")
  return tmp_path


def test_a_file_path_is_taken_and_a_missing_file_or_name_is_one_line(users_repository, monkeypatch):
  monkeypatch.chdir(users_repository)
  make = user_code.named("models/mynet.py:make", "model.name")
  assert make((8, 8, 1), 10).name == "mynet"
  assert user_code.named("mydata.py:arrays", "data.name")("eval")[0].shape == (16, 3)
  with pytest.raises(ConfigError, match=r"^model.name='models/nothere.py:make': no file .*models/nothere.py \(a path "
                                        r"is relative to the working directory "):
    user_code.named("models/nothere.py:make", "model.name")
  with pytest.raises(ConfigError, match=r"^file 'models/mynet.py' has no 'build' \(model.name='models/mynet.py:build'\)$"):
    user_code.named("models/mynet.py:build", "model.name")


@pytest.mark.e2e
def test_a_users_package_named_models_is_said_in_one_line_and_its_file_trains(users_repository):
  """In the user's own folder, on PYTHONPATH: models.mynet is shadowed by the framework's models/ package."""
  env = {**os.environ, "PYTHONPATH": pythonpath(str(users_repository))}
  command = [sys.executable, f"{REPO}/main.py", f"--config={REPO}/configs/digits_cnn.py", "--config.train.steps=20",
             "--config.summary.progress_bar=off", "--config.export=False", "--workdir=runs/mine"]
  shadowed = run_command(command + ["--config.model.name=models.mynet:make"], env=env, cwd=str(users_repository))
  assert shadowed.returncode == 1 and shadowed.stderr.strip().splitlines()[-1] == (
      "error: cannot import module 'models.mynet' for model.name='models.mynet:make': 'models' is this framework's "
      "own package (models/), which hides yours of the same name; name your code by its file: "
      "model.name=path/to/models/mynet.py:make"), shadowed.stderr[-2000:]
  trained = run_command(command + ["--config.model.name=models/mynet.py:make"], env=env, cwd=str(users_repository))
  assert trained.returncode == 0, trained.stderr[-3000:]
  summary = json.load(open(users_repository / "runs" / "mine" / "summary.json"))
  assert summary["eval/accuracy"] > 0.3 and json.load(open(users_repository / "runs" / "mine" / "config.json"))[
      "model"]["name"] == "models/mynet.py:make"


@pytest.mark.parametrize("source, said", [
    ("def make(input_shape, num_classes)\n  return None\n", "SyntaxError: expected ':' (in {file}:1)"),
    ("import os\nraise RuntimeError('my module fails')\n", "RuntimeError: my module fails (in {file}:2)"),
])
def test_a_users_file_or_module_failing_as_it_is_imported_is_one_line_naming_its_line(tmp_path, monkeypatch, source,
                                                                                    said):
  (tmp_path / "mine.py").write_text(source)
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  for path in ("mine.py:make", "mine:make"):
    with pytest.raises(ConfigError) as raised:
      user_code.named(path, "model.name")
    where = path.split(":")[0]
    assert str(raised.value) == (f"model.name='{path}': importing {where} failed: "
                                 + said.format(file=tmp_path / "mine.py")), path
    sys.modules.pop("mine", None)
