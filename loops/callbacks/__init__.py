"""Callbacks: the `Callback` base class, the built-ins (one file each) and the user's, in one fixed order.

A callback is any object with some of the hooks of `Callback` (loops/core/interfaces.py), each taking the loop's
State; subclassing `Callback` is optional. A `trigger` attribute (a `Trigger`) makes the loop end a train call on
each of its boundaries. Everything a callback writes goes through state.writer (a no-op off the chief).
"""

from loops.callbacks.built_in import OBSERVERS, SAVING, Run, make
from loops.callbacks.checkpointing import BestCheckpoint, Checkpointing
from loops.callbacks.early_stopping import EarlyStopping
from loops.callbacks.eval_log import EvalLog
from loops.callbacks.export import Export
from loops.callbacks.histograms import Histograms
from loops.callbacks.overview import Overview
from loops.callbacks.profile_trace import ProfileTrace
from loops.callbacks.run_summary import RunSummary
from loops.callbacks.sweep_trial import SweepTrial
from loops.callbacks.train_log import TrainLog
from loops.callbacks.workers import WorkerMonitor
from loops.core import plugins
from loops.core.interfaces import HOOKS, Callback
from loops.core.loop import Trigger

__all__ = ["BestCheckpoint", "Callback", "Checkpointing", "EarlyStopping", "EvalLog", "Export", "HOOKS",
           "Histograms", "OBSERVERS", "Overview", "ProfileTrace", "Run", "RunSummary", "SAVING", "SweepTrial",
           "TrainLog", "Trigger", "WorkerMonitor", "assemble", "load_user", "make"]


def assemble(built_in_first, user, built_in_last):
  """The fixed order: observers, then user callbacks, then the saving phase and the run summary."""
  return [*built_in_first, *user, *built_in_last]


def load_user(config, names, sweep, checkpoint, eval_settings, objects=()):
  """[(name, callback)]: instances of `names` (the `callbacks` setting: "package.module:factory",
  factory(config), the user's factories given the config bag), the sweep's trial, then `objects` (passed by Python
  callers). loops/rules.py checks their hooks."""
  made = [(name, plugins.load_callable(name, "callbacks", 1)(config)) for name in names]
  if sweep.settings or sweep.study:
    made.append(("SweepTrial", SweepTrial(sweep, checkpoint, eval_settings)))
  return made + [(type(obj).__name__, obj) for obj in objects]
