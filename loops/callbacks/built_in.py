"""The built-in callbacks of a training run, in their fixed order; each class's `for_run(run)` makes it from the
settings it reads (None when they turn it off)."""

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
  config: Any  # the resolved config
  workdir: str
  parts: Any  # loops/build.Parts
  execution: Any  # loops/distribute/execution (train, evaluate, averaged_weights, gradient_norms)
  checkpoints: Any  # loops/persist/checkpoints.Checkpoints
  wall_started: float  # time.perf_counter() when the run began


def make(run, classes):
  """[callback] of `classes` that the run's settings turn on, in order."""
  return [c for c in (cls.for_run(run) for cls in classes) if c is not None]
