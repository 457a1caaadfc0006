"""A sweep's Optuna study (--search=tpe, or any search with --prune=asha|hyperband): DIR/study.log.

The study lives in Optuna's journal file storage (`JournalStorage(JournalFileBackend)`: appends under a file lock,
safe for several processes and nodes on a shared filesystem, no database server). Trial i of the sweep is the Optuna
trial whose user attribute `index` is i (and `name`, its workdir's name): asked once, by the local sweep when a slot
frees or by the SLURM array task i, then found again by every rerun or requeue. A failed trial (told FAIL) gets a
new Optuna trial with the same values (and distributions) on the next rerun. grid and random points are fixed in
advance (asked with the space's distributions, a sampler giving the point's values); tpe asks Optuna's TPE sampler
(seeded, `constant_liar` for the trials still running) over the space: `loguniform:a:b`, `uniform:a:b`, `int:a:b`
and lists (categorical). Every trial gets the same distribution per key (Optuna refuses another kind, or other
choices, for a parameter name). The runs report to the trial and are pruned inside (loops/callbacks/sweep_trial.py).
The recorded space, metric, direction, search and pruner are checked on every rerun: a change is one error line.
"""

import contextlib
import signal
import threading
import warnings

from launch import sweep_grid

STUDY_FILE = "study.log"
STUDY_NAME = "sweep"  # loops/callbacks/sweep_trial.py loads it by this name
SEARCHES, PRUNERS = ("grid", "random", "tpe"), ("none", "asha", "hyperband")


def uses_study(search, prune):
  return search == "tpe" or prune != "none"


def record_of(sweep):
  """What the study records and checks, from the sweep's record (trials.json)."""
  return {"space": sweep["grid"], "metric": sweep["metric"], "mode": sweep["mode"], "search": sweep["search"],
          "prune": sweep["prune"], "seed": sweep["seed"], "trials": sweep["count"]}


def fixed_points(sweep, grid):
  """The points of a grid or random sweep, fixed in advance (none for tpe)."""
  if sweep["search"] == "tpe":
    return []
  return sweep_grid.trials(grid, sweep["random"], sweep["seed"])


def distributions(grid):
  """{KEY: an Optuna distribution} for the tpe sampler."""
  import optuna  # pylint: disable=import-outside-toplevel

  space = {}
  for key, values in grid.items():
    if isinstance(values, sweep_grid.Range):
      if values.kind == "int":
        space[key] = optuna.distributions.IntDistribution(int(values.low), int(values.high))
      else:
        space[key] = optuna.distributions.FloatDistribution(values.low, values.high, log=values.kind == "loguniform")
    else:
      space[key] = optuna.distributions.CategoricalDistribution(values)
  return space


def _sampler(search, seed, trials):
  import optuna  # pylint: disable=import-outside-toplevel

  if search == "tpe":
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
      return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, trials // 3)), constant_liar=True)
  return optuna.samplers.RandomSampler(seed=seed)


def open_study(path, record, create=True):
  """The study at `path`, created on first use; SweepError (one line) when the recorded space, metric, direction,
  search or pruner differ from `record` ({'space', 'metric', 'mode', 'search', 'prune', 'seed', 'trials'})."""
  import optuna  # pylint: disable=import-outside-toplevel
  from optuna.storages import journal  # pylint: disable=import-outside-toplevel

  optuna.logging.set_verbosity(optuna.logging.WARNING)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    storage = journal.JournalStorage(journal.JournalFileBackend(path))
  study = optuna.create_study(study_name=STUDY_NAME, storage=storage, load_if_exists=create,
                              direction="maximize" if record["mode"] == "max" else "minimize",
                              sampler=_sampler(record["search"], record["seed"], record["trials"]))
  recorded = study.user_attrs
  for key in ("space", "metric", "mode", "search", "prune"):
    if key in recorded and recorded[key] != record[key]:
      raise sweep_grid.SweepError(
          f"the sweep's study ({path}) has {key} {recorded[key]!r}, this command {record[key]!r}: a study "
          f"continues only with the same space, metric, search and pruner; use another --sweep_dir")
  for key in ("space", "metric", "mode", "search", "prune", "seed", "trials"):
    if key not in recorded:
      study.set_user_attr(key, record[key])
  return study


def _record(trial, sweep_dir, index):
  import os  # pylint: disable=import-outside-toplevel
  name = trial.user_attrs["name"]
  return {"index": index, "name": name, "overrides": trial.user_attrs["overrides"],
          "workdir": os.path.join(sweep_dir, name), "number": trial.number}


def _text(value, digits=3):
  """A trial's value as its name shows it (3 significant digits), or as its run is given it (digits None: all, so
  the run trains the value the study records)."""
  if isinstance(value, str):
    return value
  return str(value) if isinstance(value, int) else repr(value) if digits is None else f"{value:.{digits}g}"


def assign(study, sweep_dir, index, grid, point=None):
  """Sweep trial `index`: the Optuna trial recorded for it (not failed), else a new one: a failed one's values again
  (with its own distributions: Optuna refuses a parameter whose kind changes), `point`'s fixed values for grid and
  random, else the sampler's over `grid` (both with the distributions of `grid`, the same for every trial);
  {'index', 'name', 'overrides', 'workdir', 'number'}. A Ctrl-C or SIGTERM meanwhile acts when it is recorded."""
  with _signals_held():
    return _assign(study, sweep_dir, index, grid, point)


@contextlib.contextmanager
def _signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
  """`signums` received inside act on leaving (their handlers then): a Ctrl-C between Optuna's ask and the trial's
  attributes left a RUNNING trial without them, which no rerun finds and the study counts (tests/test_search.py)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  received = []
  previous = {signum: signal.signal(signum, lambda number, _: received.append(number)) for signum in signums}
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    for number in received:
      signal.raise_signal(number)


def _assign(study, sweep_dir, index, grid, point):
  mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("index") == index]
  kept = [t for t in mine if t.state.name != "FAIL"]
  if kept:
    return _record(kept[-1], sweep_dir, index)
  if mine:
    trial = _ask(study, index, mine[-1].distributions, mine[-1].params)
  elif point is not None:
    trial = _ask(study, index, distributions(grid), point)
  else:  # seeded by (seed, index): the same proposal in whichever process asks (an array task, a rerun)
    recorded = study.user_attrs
    study.sampler = _sampler(recorded["search"], recorded.get("seed", 0) * 100003 + index, recorded.get("trials", 10))
    trial = _ask(study, index, distributions(grid))
  overrides = mine[-1].user_attrs["overrides"] if mine else {key: _text(value, None)
                                                              for key, value in trial.params.items()}
  names = {t.user_attrs.get("name") for t in study.get_trials(deepcopy=False) if t.user_attrs.get("index") != index}
  shown = {key: _text(value) for key, value in trial.params.items()}
  name = mine[-1].user_attrs["name"] if mine else sweep_grid.trial_name(shown)
  if name in names:  # another trial rounds to the same values (tpe): its own workdir anyway
    name = f"{name},trial={index}"
  trial.set_user_attr("overrides", overrides)
  trial.set_user_attr("name", name)
  trial.set_user_attr("index", index)
  return _record(study.get_trials(deepcopy=False)[trial.number], sweep_dir, index)


def _ask(study, index, space, values=None):
  """A new Optuna trial with a value for each key of `space` ({KEY: distribution}): `values`' (a fixed point, a
  failed trial again) or the study's sampler's. When the study refuses them, the new trial is told FAIL (never left
  RUNNING without parameters) and a SweepError says so in one line."""
  import optuna  # pylint: disable=import-outside-toplevel

  sampler = study.sampler
  if values is not None:
    study.sampler = _fixed_sampler(values)
  trial = study.ask()
  try:
    for key, distribution in space.items():
      _suggest(trial, key, distribution)
  except ValueError as e:
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    raise sweep_grid.SweepError(f"the sweep's study refuses trial {index}'s values (Optuna: {e}): use another "
                                "--sweep_dir") from None
  finally:
    study.sampler = sampler
  return trial


def _suggest(trial, key, distribution):
  """trial.suggest_* for an Optuna distribution (the public way to give a trial a value of that distribution)."""
  import optuna  # pylint: disable=import-outside-toplevel

  if isinstance(distribution, optuna.distributions.CategoricalDistribution):
    return trial.suggest_categorical(key, distribution.choices)
  if isinstance(distribution, optuna.distributions.IntDistribution):
    return trial.suggest_int(key, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
  return trial.suggest_float(key, distribution.low, distribution.high, step=distribution.step, log=distribution.log)


def _fixed_sampler(values):
  """An Optuna sampler that proposes `values` ({KEY: value}, typed as each distribution's values). Optuna's own
  ways would let another process take them (enqueue_trial) or record a distribution of another kind (one-value)."""
  import optuna  # pylint: disable=import-outside-toplevel

  class Fixed(optuna.samplers.BaseSampler):

    def infer_relative_search_space(self, study, trial):
      return {}

    def sample_relative(self, study, trial, search_space):
      return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
      value = values[param_name]
      if isinstance(param_distribution, optuna.distributions.IntDistribution):
        return int(value)
      return float(value) if isinstance(param_distribution, optuna.distributions.FloatDistribution) else value

  return Fixed()


def known(study, sweep_dir):
  """The sweep trials the study holds, by index (the latest not failed, else the failed one)."""
  import optuna  # pylint: disable=import-outside-toplevel

  by_index = {}
  for trial in study.get_trials(deepcopy=False):
    index = trial.user_attrs.get("index")
    if index is None or "name" not in trial.user_attrs:
      continue
    if index not in by_index or trial.state != optuna.trial.TrialState.FAIL:
      by_index[index] = _record(trial, sweep_dir, index)
  return [by_index[i] for i in sorted(by_index)]


def states(study):
  """{Optuna trial number: 'complete' | 'pruned' | 'failed' | 'running'}."""
  names = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}
  return {t.number: names.get(t.state.name, t.state.name.lower()) for t in study.get_trials(deepcopy=False)}


def fail(study, number):
  """Tells the study trial `number` failed (its run ended with an error), unless it is finished already."""
  import optuna  # pylint: disable=import-outside-toplevel

  trial = study.get_trials(deepcopy=False)[number]
  if not trial.state.is_finished():
    study.tell(number, state=optuna.trial.TrialState.FAIL)
