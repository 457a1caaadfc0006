"""The built-in callbacks of a training run, in their fixed order; each class's `for_run(run, *sections)` makes it
from the settings sections it names in `READS` (configs/settings.py; None when they turn it off)."""

import dataclasses
from typing import Any

from loops.callbacks.checkpointing import BestCheckpoint, Checkpointing
from loops.callbacks.early_stopping import EarlyStopping
from loops.callbacks.eval_log import EvalLog
from loops.callbacks.export import Export
from loops.callbacks.histograms import Histograms
from loops.callbacks.overview import Overview
from loops.callbacks.profile_trace import ProfileTrace
from loops.callbacks.run_summary import RunSummary
from loops.callbacks.train_log import TrainLog
from loops.callbacks.workers import WorkerMonitor

# Before the user's callbacks: what observes a call and an eval. After them: what saves and sums up.
OBSERVERS = (ProfileTrace, Overview, TrainLog, WorkerMonitor, Histograms, EvalLog, BestCheckpoint, EarlyStopping)
SAVING = (Checkpointing, Export, RunSummary)


@dataclasses.dataclass(frozen=True)
class Run:
  """What a built-in callback is made from."""
  config: Any  # the resolved config bag, as a record only (Overview writes it); settings come as sections
  workdir: str
  parts: Any  # loops/build.Parts
  execution: Any  # loops/distribute/execution (train, evaluate, averaged_weights, gradient_norms)
  checkpoints: Any  # loops/persist/checkpoints.Checkpoints
  wall_started: float  # time.perf_counter() when the run began


def make(run, settings, classes):
  """[callback] of `classes` that the run's settings turn on, in order: each given the sections it READS."""
  made = (cls.for_run(run, *(getattr(settings, name) for name in getattr(cls, "READS", ()))) for cls in classes)
  return [c for c in made if c is not None]
