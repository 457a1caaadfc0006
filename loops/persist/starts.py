"""The run's own record of its starts, and what a resume may change.

Every start of training appends one line to `workdir/starts.jsonl` (never rewritten): when, at which step, on how
many replicas and input pipelines, the resolved config and the derived plan. A resume compares its config with the
last start's (`compare`):

  * settings that change what is optimised or how (the data, the model, the loss, the optimizer and its schedule,
    the global batch, the seed, the precision, ...): the run stops with one line listing `key: recorded -> now`,
    unless `resume.accept_changes=True`; an accepted change takes effect in training and is recorded;
  * settings that change neither (length, eval/checkpoint cadence, logging, callbacks, the strategy, the devices,
    the cluster, where the data lives): accepted, logged and recorded;
  * another number of replicas or workers keeps the recorded global batch and peak learning rate
    (`kept_plan_values`): the per-replica batch is re-derived, never the optimisation.

Pure Python (no TensorFlow): the sequencing is unit-tested on its own.
"""

from __future__ import annotations

import datetime
import json
import posixpath
from typing import Iterable, Optional

from configs import base
from errors import ConfigError

FILE = "starts.jsonl"

# The settings the global batch and the peak learning rate are derived from (besides the replica count).
BATCH_AND_LR = ("train.global_batch_size", "train.per_replica_batch_size", "optimizer.learning_rate",
                "optimizer.lr_scaling")


def flatten(tree: dict, prefix: str = "") -> dict:
  """{'a.b': leaf} for a nested dict; lists are leaves, empty groups (e.g. model.kwargs) leave no key."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
  return flat


def is_accepted(key: str) -> bool:
  """Whether a resume may change the setting as it is (configs/base.py's RESUMABLE: prefixes end with ".")."""
  return any(key == name or (name.endswith(".") and key.startswith(name)) for name in base.RESUMABLE)


ABSENT = "(absent)"


# Defaults that changed, {key: (the old default, the new one)}: a record of the old one resumes under the new one.
# loss.name "" (2026-11-26) trains what the old default did unless the model is compile()d with a loss.
RENAMED_DEFAULTS = {"loss.name": ("sparse_categorical_crossentropy", "")}


def _as_now(flat: dict) -> dict:
  return {key: (RENAMED_DEFAULTS[key][1] if key in RENAMED_DEFAULTS and value == RENAMED_DEFAULTS[key][0] else value)
          for key, value in flat.items()}


def compare(recorded: dict, now: dict) -> tuple[list, list]:
  """(changes that need resume.accept_changes, changes accepted as they are): lists of (key, recorded, now)."""
  same_recorded, same_now = _as_now(recorded), _as_now(now)
  changed = [(key, recorded.get(key, ABSENT), now.get(key, ABSENT))
             for key in sorted(set(recorded) | set(now)) if same_recorded.get(key) != same_now.get(key)]
  refused = [change for change in changed if not is_accepted(change[0])]
  accepted = [change for change in changed if is_accepted(change[0])]
  return refused, accepted


def describe(changes: Iterable[tuple]) -> str:
  return ", ".join(f"{key}: {_show(old)} -> {_show(new)}" for key, old, new in changes)


def _show(value):
  return json.dumps(value) if isinstance(value, str) and value != ABSENT else str(value)


def kept_plan_values(recorded: Optional[dict], changed_keys: Iterable[str]) -> Optional[dict]:
  """{'global_batch_size', 'learning_rate'} the resumed run keeps from the recorded plan, or None when the settings
  they come from changed (an accepted change: the new values are derived) or nothing was recorded."""
  if not recorded or "plan" not in recorded:
    return None
  if any(key in BATCH_AND_LR for key in changed_keys):
    return None
  plan = recorded["plan"]
  return {"global_batch_size": plan["global_batch_size"], "learning_rate": plan["learning_rate"]}


def parse(text: str, name: str = FILE) -> list[dict]:
  """The starts in a starts.jsonl text; ConfigError naming the first line that is not one start's JSON (torn or
  edited): a resume cannot judge its changes against a record it cannot read."""
  starts = []
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      start = json.loads(line)
    except json.JSONDecodeError as e:
      start = e
    if not isinstance(start, dict):
      raise ConfigError(f"{name} line {number} is not a start's record ({_excerpt(line)}): torn or edited; the "
                        "resume compares its settings with the last start's, so repair or remove that line (one JSON "
                        "object per start) and rerun")
    starts.append(start)
  return starts


def _excerpt(line):
  return repr(line[:40] + "..." if len(line) > 40 else line)


def entry(step: int, config: dict, plan: dict, accepted: list, process: str) -> dict:
  return {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "step": step,
          "process": process, "accepted_changes": [list(change) for change in accepted], "plan": plan,
          "config": config}


def read(workdir: str) -> list[dict]:
  """The starts recorded in workdir (none when it has no record)."""
  import tensorflow as tf
  name = posixpath.join(workdir, FILE)
  return parse(tf.io.gfile.GFile(name).read(), name) if tf.io.gfile.exists(name) else []


def append(workdir: str, start: dict) -> None:
  """Adds one start to the record: the whole file is rewritten to a temporary name and renamed over it, so a crash
  leaves the old record or the new one (gfile has no append on object stores)."""
  import tensorflow as tf
  name = posixpath.join(workdir, FILE)
  before = tf.io.gfile.GFile(name).read() if tf.io.gfile.exists(name) else ""
  if before and not before.endswith("\n"):
    before += "\n"  # a record that lost its last newline: the new start still gets a line of its own
  with tf.io.gfile.GFile(name + ".tmp", "w") as f:
    f.write(before + json.dumps(start) + "\n")
  tf.io.gfile.rename(name + ".tmp", name, overwrite=True)
