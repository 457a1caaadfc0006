"""SweepTrial: a `python -m launch.sweep` trial's link to its sweep (config.sweep.*, set by the sweep, never by hand).

Always: summary.json gets `sweep_settings` (the fingerprint of the trial's settings), so a rerun of the sweep counts
the trial complete only when its own summary proves it ran the current settings. With an Optuna study
(`sweep.study`, the journal file in the sweep directory; `sweep.trial`, the trial's number): at every eval the chief
reports checkpoint.best_metric to the trial; when the study's pruner (`--prune=asha|hyperband`, resources in train
steps, the first rung at the first eval) says stop, the run stops there as an early stop ("pruned at step S (value
V)": the final checkpoint is saved, and a rerun does not train it further, even with a longer train.steps). At the
end the trial is told its best value (or that it was pruned). Every process reaches the same stop: the loop agrees on the chief's stop reason.
"""

import math
import warnings

from errors import ConfigError
from loops import private_apis
from loops.core.interfaces import Callback

STUDY_NAME = "sweep"
REDUCTION_FACTOR = 3


def load_study(path):
  """The sweep's study in its journal file (Optuna's file storage: safe for several processes and nodes)."""
  import optuna  # pylint: disable=import-outside-toplevel
  from optuna.storages import journal  # pylint: disable=import-outside-toplevel

  optuna.logging.set_verbosity(optuna.logging.WARNING)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    storage = journal.JournalStorage(journal.JournalFileBackend(path))
  return optuna.load_study(study_name=STUDY_NAME, storage=storage)


def make_pruner(kind, first_eval_step, total_steps):
  """Optuna's pruner for --prune (resources counted in train steps; the first rung at the first eval)."""
  import optuna  # pylint: disable=import-outside-toplevel

  first = max(1, first_eval_step)
  if kind == "asha":
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=REDUCTION_FACTOR)
  if kind == "hyperband":
    return optuna.pruners.HyperbandPruner(min_resource=first, max_resource=max(first, total_steps),
                                          reduction_factor=REDUCTION_FACTOR)
  return optuna.pruners.NopPruner()


class SweepTrial(Callback):
  """Reports each eval to the sweep's Optuna trial, stops the run when pruned, tells the study the result."""

  def __init__(self, sweep, checkpoint, eval_settings):
    """sweep, checkpoint, eval_settings: those sections of the run's settings (configs/settings.py)."""
    self.settings, self.path, self.number = sweep.settings, sweep.study, sweep.trial
    self.metric, self.mode = checkpoint.best_metric, checkpoint.best_mode
    self.every_steps = eval_settings.every_steps
    self.trial, self.pruned = None, None

  def on_train_begin(self, state):
    if not (self.path and state.is_chief):
      return
    import optuna  # pylint: disable=import-outside-toplevel

    study = load_study(self.path)
    recorded = study.user_attrs
    if (recorded.get("metric"), recorded.get("mode")) != (self.metric, self.mode):
      raise ConfigError(f"the sweep's study optimises {recorded.get('metric')} ({recorded.get('mode')}), this trial's "
                        f"checkpoint.best_metric is {self.metric} ({self.mode}): start a new sweep directory")
    study.pruner = make_pruner(recorded.get("prune", "none"), self.every_steps or state.total_steps, state.total_steps)
    frozen = study.get_trials(deepcopy=False)[self.number]
    if frozen.state == optuna.trial.TrialState.PRUNED:  # pruned stays pruned, even when the sweep's length grew
      self.pruned = {"step": frozen.last_step, "value": frozen.intermediate_values[frozen.last_step]}
      state.request_stop(f"pruned at step {self.pruned['step']} (value {self.pruned['value']:.4g})")
    elif not frozen.state.is_finished():  # a rerun of a complete trial evaluates again: nothing to report
      self.trial = optuna.trial.Trial(study, private_apis.trial_id(frozen))

  def after_eval(self, state):
    value = state.eval.get(self.metric)
    if self.trial is None or value is None:
      return
    self.trial.report(float(value), state.step)
    if state.step < state.total_steps and (math.isnan(value) or self.trial.should_prune()):
      self.pruned = {"step": state.step, "value": float(value)}
      state.request_stop(f"pruned at step {state.step} (value {value:.4g})")

  def on_train_end(self, state):
    state.summary["sweep_settings"] = self.settings
    if not (self.path and state.is_chief):
      return
    import optuna  # pylint: disable=import-outside-toplevel

    state.summary["sweep_trial"] = self.number
    if self.pruned:
      state.summary["pruned"] = self.pruned
    if self.trial is None:
      return
    if self.pruned:
      self.trial.study.tell(self.trial, state=optuna.trial.TrialState.PRUNED)
      return
    reported = self.trial.study.get_trials(deepcopy=False)[self.number].intermediate_values
    values = [v for v in reported.values() if not math.isnan(v)]
    if state.step >= state.total_steps or state.stop_reason:
      best = (max if self.mode == "max" else min)(values) if values else None
      self.trial.study.tell(self.trial, best, state=None if best is not None else optuna.trial.TrialState.FAIL)
