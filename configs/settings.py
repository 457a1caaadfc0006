"""The settings of a run: the config bag read once, after the rules, into typed, immutable sections.

`read(config) -> Settings` is called once, when loops/rules.py has passed the config (loops/run.py). Its sections
are frozen dataclasses generated from configs/base.py: one per top-level group of `get_config()` (`data`, `model`,
`train`, `checkpoint`, ...) and `run` for the top-level keys (`seed`, `strategy`, `mode`, ...). Each field's type
comes from its default (a placeholder's declared type, or None), its documentation (`field.metadata["doc"]`) from
the key's comment in configs/base.py, so a new key is still declared in that one file. Nested groups
(`data.tfrecord`) are nested sections; the free-form `*.kwargs` groups are read-only mappings.

The composer (loops/run.py, loops/build.py) hands each module the section(s) it uses, never the whole Settings (but
to loops/build.py's build_from and loops/dry_run.py's report, which make and report every part of a run).
"""

import dataclasses
import os
import types
from typing import Any, Mapping, Optional

import ml_collections

from configs import base
from errors import ConfigError

RUN = "run"  # the section of the top-level keys


def _doc_of():
  with open(os.path.join(os.path.dirname(__file__), "base.py")) as f:
    return base.meanings(f.read())


_DOCS = _doc_of()


def _is_group(value):
  return isinstance(value, ml_collections.ConfigDict)


def _is_free_form(key):
  return key.endswith("kwargs")


def _class_name(path):
  return "".join(part.capitalize() for part in path.split(".") if part) + "Settings"


def _field_type(group, key):
  """The type a value of `key` must have: its default's, a placeholder's declared one (then None too)."""
  value = group[key]
  if value is None:
    return Optional[group.get_type(key)]
  return tuple if isinstance(value, list) else type(value)


def _section_class(group, path):
  """A frozen dataclass of `group`'s keys (its nested groups as nested section classes)."""
  fields = []
  for key in group.keys():
    value, dotted = group[key], f"{path}.{key}" if path else key
    doc = _DOCS.get(dotted, "")
    if _is_group(value) and _is_free_form(key):
      kind = Mapping[str, Any]
    elif _is_group(value):
      kind = _section_class(value, dotted)
    else:
      kind = _field_type(group, key)
    fields.append((key, kind, dataclasses.field(metadata={"doc": doc, "key": dotted})))
  cls = dataclasses.make_dataclass(_class_name(path or RUN), fields, frozen=True)
  cls.__module__ = __name__
  cls.__doc__ = f"configs/base.py's {path or 'top-level'} keys, read once (configs/settings.py)."
  return cls


def _top_level_run(config):
  """A group of the top-level keys that are not groups, as a ConfigDict (their types kept)."""
  run = ml_collections.ConfigDict()
  for key in config.keys():
    if not _is_group(config[key]):
      run[key] = config.get_ref(key) if config[key] is None else config[key]
  return run


def _classes():
  defaults = base.get_config()
  sections = {RUN: _section_class(_top_level_run(defaults), "")}
  sections.update({key: _section_class(defaults[key], key) for key in defaults.keys() if _is_group(defaults[key])})
  return sections


SECTIONS = _classes()  # {section name: its dataclass}
for _cls in SECTIONS.values():
  globals()[_cls.__name__] = _cls  # RunSettings, DataSettings, CheckpointSettings, ... (type hints)
Settings = dataclasses.make_dataclass("Settings", [(name, cls) for name, cls in SECTIONS.items()], frozen=True)
Settings.__module__ = __name__
Settings.__doc__ = "Every section of a run's settings (configs/settings.py); hand out sections, not this."


def _plain(config):
  return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _type_name(kind):
  args = getattr(kind, "__args__", None)
  if args:
    return " or ".join("None" if a is type(None) else a.__name__ for a in args)
  return kind.__name__


def _accepts(kind, value):
  allowed = getattr(kind, "__args__", None) or (kind,)
  for a in allowed:
    if a is type(None) and value is None:
      return True
    if a is float and isinstance(value, (int, float)) and not isinstance(value, bool):
      return True
    if a is tuple and isinstance(value, (tuple, list)):
      return True
    if a is int and isinstance(value, bool):
      continue
    if a not in (type(None), float, tuple) and isinstance(value, a):
      return True
  return False


def _frozen(value):
  """Lists become tuples (nested too): a settings value cannot change."""
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


def _section(cls, values, path):
  unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
  if unknown:
    raise ConfigError(f"config key {path}{unknown[0]} is not a setting of configs/base.py")
  made = {}
  for field in dataclasses.fields(cls):
    key = f"{path}{field.name}"
    if field.name not in values:
      raise ConfigError(f"config key {key} is missing (every key of configs/base.py is read)")
    value = values[field.name]
    if dataclasses.is_dataclass(field.type):
      if not isinstance(value, Mapping):
        raise ConfigError(f"config key {key} is {value!r}; expected a group of keys")
      made[field.name] = _section(field.type, value, f"{key}.")
    elif field.type is Mapping[str, Any]:
      made[field.name] = types.MappingProxyType(dict(value))
    elif not _accepts(field.type, value):
      raise ConfigError(f"config key {key} is {value!r} ({type(value).__name__}); expected {_type_name(field.type)}")
    else:
      made[field.name] = _frozen(value)
  return cls(**made)


def replaced(section, path, **changes):
  """`section` with `changes`, each checked as read() checks a value (one ConfigError line); path: its prefix
  ("optimizer.")."""
  kinds = {field.name: field.type for field in dataclasses.fields(section)}
  for key, value in changes.items():
    if key not in kinds:
      raise ConfigError(f"config key {path}{key} is not a setting of configs/base.py")
    kind = kinds[key]
    if kind is Mapping[str, Any]:
      changes[key] = types.MappingProxyType(dict(value))
    elif dataclasses.is_dataclass(kind):
      raise ConfigError(f"config key {path}{key} is {value!r}; expected a group of keys")
    elif not _accepts(kind, value):
      raise ConfigError(f"config key {path}{key} is {value!r} ({type(value).__name__}); expected {_type_name(kind)}")
    else:
      changes[key] = _frozen(value)
  return dataclasses.replace(section, **changes)


def read(config) -> Settings:
  """The config (a ConfigDict or nested dict with every key of configs/base.py) as Settings.

  Raises:
    ConfigError: one line naming a key whose value has the wrong type, or a missing or unknown key.
  """
  values = _plain(config)
  top = {key: value for key, value in values.items() if key not in SECTIONS or key == RUN}
  sections = {RUN: _section(SECTIONS[RUN], {k: v for k, v in top.items() if not isinstance(v, Mapping)}, "")}
  groups = {k for k, v in top.items() if isinstance(v, Mapping)}
  if groups:
    raise ConfigError(f"config key {sorted(groups)[0]} is not a setting of configs/base.py")
  for name in SECTIONS:
    if name != RUN:
      if name not in values:
        raise ConfigError(f"config key {name} is missing (every key of configs/base.py is read)")
      sections[name] = _section(SECTIONS[name], values[name], f"{name}.")
  return Settings(**sections)


def docs(section) -> dict:
  """{field: its meaning} of a section class or instance (configs/base.py's comments)."""
  return {f.name: f.metadata["doc"] for f in dataclasses.fields(section)}
