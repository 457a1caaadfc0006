"""Errors a user can fix (bad config, missing data, bad cluster); main.py prints them as one line."""

import difflib


class ConfigError(ValueError):
  """A setting, name or environment value the run cannot use; the message says what is valid."""


def unknown_name(kind, name, valid):
  """ConfigError for a name missing from a registry, with the nearest valid name when there is one."""
  valid = list(valid)
  close = difflib.get_close_matches(str(name), valid, n=1)
  hint = f" (did you mean '{close[0]}'?)" if close else ""
  return ConfigError(f"unknown {kind} '{name}'{hint}; valid: {', '.join(valid)}")
