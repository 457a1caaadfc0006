"""What a resume may change: the run's recorded starts against the config it is given (loops/persist/starts.py).

  decide(config, workdir, trains, accept_changes)  before anything is built: refuses an unaccepted change of the
                                    optimisation (one line), returns what the plan keeps (global batch, peak lr)
  record(...)                       once the checkpoint is restored: logs what changed, appends this start
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Any, Optional

from absl import logging

from errors import ConfigError
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import starts


@dataclasses.dataclass(frozen=True)
class Resume:
  recorded: Optional[dict] = None  # the last start, when the workdir has one and a checkpoint to resume
  changes: tuple = ()  # (key, recorded, now) of every changed setting, accepted
  kept: Optional[dict] = None  # plan values kept from the record: global_batch_size, learning_rate


def config_values(config: Any) -> dict:
  """The config as the record holds it: flat keys, JSON values."""
  return starts.flatten(json.loads(config.to_json_best_effort()))


def decide(config: Any, workdir: str, trains: bool, accept_changes: bool) -> Resume:
  """Compares config with the workdir's last start, when there is a checkpoint to resume.

  Args:
    config: the resolved config of this run (the record: every key's value).
    workdir: the run's workdir.
    trains: this process trains (an evaluator only keeps the recorded plan; it never refuses).
    accept_changes: resume.accept_changes.

  Raises:
    ConfigError: a setting of the optimisation or the data changed and resume.accept_changes is False.
  """
  recorded = (starts.read(workdir) or [None])[-1]
  if recorded is None or not checkpoints_lib.index_paths(posixpath.join(workdir, "checkpoints")):
    return Resume()
  refused, accepted = starts.compare(starts.flatten(recorded["config"]), config_values(config))
  if refused and trains and not accept_changes:
    raise ConfigError(f"{workdir} holds a run trained with other settings: {starts.describe(refused)}; to train on "
                      "with the new values pass --config.resume.accept_changes=True, to start over use a new "
                      "--workdir")
  changes = tuple(refused + accepted)
  return Resume(recorded, changes, starts.kept_plan_values(recorded, [key for key, _, _ in changes]))


def record(resume: Resume, config: Any, plan: Any, step: int, workdir: str, role: Any) -> None:
  """Logs what this start changed (settings, replica count) and appends it to the record (chief)."""
  if resume.changes:
    logging.warning("resumed with changed settings (recorded -> now): %s", starts.describe(resume.changes))
  recorded_plan = (resume.recorded or {}).get("plan", {})
  if recorded_plan and recorded_plan["replicas"] != plan.replicas:
    kept = "kept" if resume.kept else "derived anew (their settings changed)"
    logging.warning("resumed on %d replica(s), recorded %d: global batch %d and learning rate %g %s; per-replica "
                    "batch %d", plan.replicas, recorded_plan["replicas"], plan.global_batch_size, plan.learning_rate,
                    kept, plan.per_replica_batch_size)
  if role.is_chief:
    starts.append(workdir, starts.entry(step, json.loads(config.to_json_best_effort()), dataclasses.asdict(plan),
                                        list(resume.changes), f"{role.type}:{role.index}"))
