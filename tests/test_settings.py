"""configs/settings.py: the config bag read once into typed, immutable sections generated from configs/base.py."""

import dataclasses
import os
import types

import pytest

from configs import base
from configs import digits_cnn
from configs import settings
from errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _base_meanings():
  with open(os.path.join(REPO, "configs", "base.py")) as f:
    return base.meanings(f.read())


def _section_and_field(read, key):
  """(section instance, field name) of a configs/base.py key; top-level keys are in the `run` section."""
  parts = key.split(".")
  node = read.run if len(parts) == 1 else getattr(read, parts[0])
  for part in parts[1:-1]:
    node = getattr(node, part)
  return node, parts[-1]


def test_every_base_key_is_a_field_of_its_section_with_its_doc():
  read, meanings = settings.read(base.get_config()), _base_meanings()
  keys = [key for key, _ in base._leaves(base.get_config())]  # pylint: disable=protected-access
  assert len(keys) > 100
  for key in keys:
    section, name = _section_and_field(read, key)
    fields = {f.name: f for f in dataclasses.fields(section)}
    assert name in fields, f"{key} is not a field of {type(section).__name__}"
    assert fields[name].metadata["doc"] == meanings[key], key
    assert fields[name].metadata["doc"], f"{key} has no meaning in configs/base.py"


def test_values_are_the_configs():
  config = digits_cnn.get_config()
  read = settings.read(config)
  for key, value in base._leaves(config):  # pylint: disable=protected-access
    section, name = _section_and_field(read, key)
    got = getattr(section, name)
    if key.endswith("kwargs"):
      assert isinstance(got, types.MappingProxyType) and dict(got) == value.to_dict(), key
    else:
      assert got == (tuple(value) if isinstance(value, list) else value), key


def test_a_config_variant_reads():
  config = digits_cnn.get_config()
  config.model.kwargs.width = 8
  read = settings.read(config)
  assert read.train == settings.read(digits_cnn.get_config()).train
  assert read.model.kwargs["width"] == 8 and read.run.seed == config.seed
  assert isinstance(read.checkpoint, settings.SECTIONS["checkpoint"])


@pytest.mark.parametrize("key, value, expected", [
    ("train.steps", "ten", "config key train.steps is 'ten' (str); expected int or None"),
    ("seed", 1.5, "config key seed is 1.5 (float); expected int"),
    ("data.tfrecord.verify", "yes", "config key data.tfrecord.verify is 'yes' (str); expected bool"),
    ("optimizer.learning_rate", "0.1", "config key optimizer.learning_rate is '0.1' (str); expected float"),
])
def test_a_wrong_type_is_one_line_naming_the_key_value_and_type(key, value, expected):
  values = base.get_config().to_dict()
  node = values
  for part in key.split(".")[:-1]:
    node = node[part]
  node[key.split(".")[-1]] = value
  with pytest.raises(ConfigError) as raised:
    settings.read(values)
  assert str(raised.value) == expected


def test_an_int_is_a_float_and_a_list_a_tuple():
  values = base.get_config().to_dict()
  values["optimizer"]["learning_rate"] = 1
  values["train"]["freeze"] = ["conv"]
  read = settings.read(values)
  assert read.optimizer.learning_rate == 1 and read.train.freeze == ("conv",)


def test_unknown_and_missing_keys_are_one_line():
  values = base.get_config().to_dict()
  values["train"]["stepz"] = 3
  with pytest.raises(ConfigError, match=r"^config key train.stepz is not a setting of configs/base.py$"):
    settings.read(values)
  values = base.get_config().to_dict()
  del values["checkpoint"]["keep"]
  with pytest.raises(ConfigError, match=r"^config key checkpoint.keep is missing"):
    settings.read(values)


def test_settings_are_immutable():
  read = settings.read(base.get_config())
  with pytest.raises(dataclasses.FrozenInstanceError):
    read.train.steps = 5
  with pytest.raises(dataclasses.FrozenInstanceError):
    read.data.tfrecord.verify = True
  with pytest.raises(dataclasses.FrozenInstanceError):
    read.checkpoint = None
  with pytest.raises(TypeError):
    read.model.kwargs["width"] = 3
  assert isinstance(read.model.remat_layers, tuple)


def test_a_section_per_group_and_run_for_the_top_level_keys():
  config = base.get_config()
  groups = {key for key in config.keys() if hasattr(config[key], "keys")}
  assert set(settings.SECTIONS) == groups | {"run"}
  assert {f.name for f in dataclasses.fields(settings.SECTIONS["run"])} == set(config.keys()) - groups
  assert settings.docs(settings.SECTIONS["checkpoint"])["keep"] == "how many periodic checkpoints to keep in workdir/checkpoints"


def test_a_replaced_value_is_checked_as_read_checks_it():
  """A task's ctx.optimizer(learning_rate=...) replaces optimizer settings: a wrong type is the same one line."""
  read = settings.read(base.get_config())
  optimizer = read.optimizer
  changed = settings.replaced(optimizer, "optimizer.", learning_rate=1, name="adam")
  assert (changed.learning_rate, changed.name, optimizer.name) == (1, "adam", base.get_config().optimizer.name)
  model = settings.replaced(read.model, "model.", kwargs={"width": 8})
  with pytest.raises(TypeError):
    model.kwargs["width"] = 9  # a free-form group stays read-only
  with pytest.raises(ConfigError) as raised:
    settings.replaced(optimizer, "optimizer.", learning_rate="0.1")
  assert str(raised.value) == "config key optimizer.learning_rate is '0.1' (str); expected float"
  with pytest.raises(ConfigError, match=r"^config key optimizer.rate is not a setting of configs/base.py$"):
    settings.replaced(optimizer, "optimizer.", rate=0.1)
