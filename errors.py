"""The ground floor: errors a user can act on (bad config, missing data, bad cluster, lost worker), which main.py
prints as one line. Imports nothing of the project, so data/, models/ and loops/ raise the same errors with the
same "did you mean" and first-line helpers.
"""

import difflib
import re


class ConfigError(ValueError):
  """A setting, name or environment value the run cannot use; the message says what is valid."""


class UnknownNameError(ConfigError, LookupError):
  """A name missing from a registry (model, dataset, strategy, metric, ...)."""


def unknown_name(kind, name, valid):
  """UnknownNameError for a name missing from a registry, with the nearest valid name when there is one."""
  valid = [str(v) for v in valid]
  close = difflib.get_close_matches(str(name), valid, n=1)
  hint = f" (did you mean '{close[0]}'?)" if close else ""
  return UnknownNameError(f"unknown {kind} '{name}'{hint}; valid: {', '.join(valid)}")


def one_of(key, value, valid):
  """Raises unknown_name unless `value` is among `valid` (a setting's check)."""
  if value not in valid:
    raise unknown_name(key, value, valid)


def at_least(key, value, low, what="an integer"):
  """Raises ConfigError unless `value` is an integer (not a bool) >= low."""
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise ConfigError(f"{key} must be {what} >= {low}, got {value!r}")


_RAISED = re.compile(r"^(\w+(?:Error|Exception)): (.+)$")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def first_line(error):
  """The first non-empty line of an error's message, or its type name. A traced function's error ("in user code:"
  and frames) gives its cause: the error raised inside, with the last frame outside installed packages. So does a
  graph execution error: the line after "Graph execution error:", or, after the frames where its op was defined
  ("Detected at node ..."), the line above "[[{{node ...}}]]"."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if lines and lines[0] == "in user code:":
    raised = [found for found in map(_RAISED.match, lines) if found]
    if raised:
      kind, message = raised[-1].groups()
      frames = [frame for frame in _FRAME.findall(str(error)) if "site-packages" not in frame[0]]
      where = f" (in {frames[-1][0]}:{frames[-1][1]})" if frames else ""
      return (message if kind == type(error).__name__ else f"{kind}: {message}") + where
  if len(lines) > 1 and lines[0].startswith("Graph execution error"):
    if not lines[1].startswith("Detected at node"):
      return lines[1]
    node = next((n for n, line in enumerate(lines) if line.startswith("[[")), 0)
    if node > 2:
      return lines[node - 1]
  return lines[0] if lines else type(error).__name__


def described(error):
  """"Type: its first line" (first_line), or the type alone when the error has no message."""
  line, name = first_line(error), type(error).__name__
  return name if line == name else f"{name}: {line}"


class InputPipelineError(ConfigError):
  """The train input failed while a train call read it (a user's input function raised, a batch of the wrong size):
  the steps before it in the call are complete, and a run can save them before it stops."""


class WorkerLostError(RuntimeError):
  """Another process of a synchronous multi-worker job died or stopped answering; this one cannot continue."""


def unwritable_workdir(workdir, error):
  """The ConfigError for a workdir that cannot be created or written (error: an OSError or tf.errors.OpError)."""
  reason = getattr(error, "strerror", None) or getattr(error, "message", None) or str(error)
  return ConfigError(f"workdir '{workdir}' is not writable: {reason}")


def config_error_within(error):
  """The ConfigError `error` stands for, or None: TensorFlow's AutoGraph re-raises an error a traced step raised
  as StagingError("in user code: ..."), keeping the original as its context."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, ConfigError):
      return error
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None
