"""The trials of a sweep: `--grid KEY=V1,V2` specs, the full grid or N reproducible random draws, trial names.

No TensorFlow, nothing of ours: the full grid is every combination; random draws come from Optuna's GridSampler
and RandomSampler (seeded; Optuna is imported when points are drawn), the one search engine of every sweep (tpe:
launch/sweep_study.py). A value is
passed to main.py as `--config.KEY=VALUE`, exactly as written. A random sweep (`--random N --seed S`) may also
give ranges instead of values: `KEY=loguniform:LOW:HIGH`, `KEY=uniform:LOW:HIGH` (floats, drawn then rounded to 3
significant digits, so the name and the value agree) and `KEY=int:LOW:HIGH` (integers, both ends included).
"""

import ast
import hashlib
import itertools
import math
import re

KEY = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")
RANGE = re.compile(r"^(loguniform|uniform|int):([^:]+):([^:]+)$")
SAFE = re.compile(r"[^A-Za-z0-9._+\-]")
MAX_NAME = 120  # characters; longer names are cut and get a hash


class SweepError(ValueError):
  """Bad sweep input: one line saying what was wrong and what is valid."""


def split_values(text):
  """'a,(1,2),"x,y"' -> ['a', '(1,2)', '"x,y"']: commas inside brackets or quotes do not split."""
  values, depth, quote, current = [], 0, None, ""
  for char in text:
    if quote:
      quote = None if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
    elif char == "," and depth == 0:
      values.append(current.strip())
      current = ""
      continue
    current += char
  values.append(current.strip())
  return values


def parse_grid(specs):
  """['KEY=V1,V2', ...] -> {KEY: [values or a Range]} in the order given; SweepError on bad input."""
  if not specs:
    raise SweepError("give at least one --grid KEY=V1,V2 (e.g. --grid optimizer.learning_rate=0.01,0.1)")
  grid = {}
  for spec in specs:
    key, sep, text = spec.partition("=")
    key = key.strip().removeprefix("--config.").removeprefix("config.")
    if not sep or not KEY.match(key):
      raise SweepError(f"--grid {spec!r}: expected KEY=V1,V2 with a config key such as optimizer.learning_rate")
    if key in grid:
      raise SweepError(f"--grid {key} is given twice: give all its values in one --grid {key}=V1,V2")
    values = split_values(text)
    if not text.strip() or any(not v for v in values):
      raise SweepError(f"--grid {spec!r}: empty value; give one or more values separated by commas, "
                       f"e.g. {key}=0.01,0.1")
    ranges = [_range(key, v) for v in values if RANGE.match(v)]
    if ranges and len(values) > 1:
      raise SweepError(f"--grid {spec!r}: a range ({values[0]}) must be the key's only value")
    grid[key] = ranges[0] if ranges else list(dict.fromkeys(values))
  return grid


class Range:
  """A random sweep's range for one key: kind loguniform | uniform | int, inclusive bounds."""

  def __init__(self, kind, low, high):
    self.kind, self.low, self.high = kind, low, high

  def __repr__(self):
    return f"{self.kind}:{self.low:g}:{self.high:g}"


def _range(key, text):
  kind, low, high = RANGE.match(text).groups()
  try:
    low, high = (int(low), int(high)) if kind == "int" else (float(low), float(high))
  except ValueError:
    raise SweepError(f"--grid {key}={text}: bounds must be numbers ({kind}:LOW:HIGH)") from None
  if not low < high or (kind == "loguniform" and low <= 0):
    raise SweepError(f"--grid {key}={text}: need LOW < HIGH" + (" and LOW > 0" if kind == "loguniform" else ""))
  return Range(kind, low, high)


def grid_points(grid):
  """Every combination, the first key varying slowest: [{KEY: value}, ...] (an enumeration, not a draw)."""
  ranged = [key for key, values in grid.items() if isinstance(values, Range)]
  if ranged:
    raise SweepError(f"--grid {ranged[0]}={grid[ranged[0]]!r} is a range: ranges need --random N --seed S")
  return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def random_points(grid, count, seed):
  """`count` distinct points, the same on every rerun: a seeded Optuna GridSampler's first `count` over a grid of
  values, a seeded RandomSampler's draws (floats rounded to 3 significant digits) when the grid has ranges."""
  if count < 1:
    raise SweepError(f"--random must be >= 1, got {count}")
  if not any(isinstance(values, Range) for values in grid.values()):
    size = math.prod(len(values) for values in grid.values())
    if count > size:
      raise SweepError(f"--random {count}: the grid has only {size} points; use fewer or add values")
    import optuna  # pylint: disable=import-outside-toplevel
    return _sampled(grid, optuna.samplers.GridSampler(dict(grid), seed=seed), count)
  import optuna  # pylint: disable=import-outside-toplevel
  points = _sampled(grid, optuna.samplers.RandomSampler(seed=seed), count, tries=100 * count)
  if len(points) < count:
    raise SweepError(f"--random {count}: only {len(points)} distinct points could be drawn; widen the ranges")
  return points


def _sampled(grid, sampler, count, tries=None):
  """Up to `count` points of distinct names that `sampler` proposes over `grid` in an in-memory study of at most
  `tries` trials (default `count`)."""
  import optuna  # pylint: disable=import-outside-toplevel
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  points, names = [], set()

  def objective(trial):
    point = {key: _suggest(trial, key, values) for key, values in grid.items()}
    if trial_name(point) not in names:
      names.add(trial_name(point))
      points.append(point)
    if len(points) == count:
      trial.study.stop()
    return 0.0

  optuna.create_study(sampler=sampler).optimize(objective, n_trials=tries or count)
  return points


def _suggest(trial, key, values):
  """The trial's value for `key` as main.py is given it: a listed value as written, a range's draw as text."""
  if not isinstance(values, Range):
    return trial.suggest_categorical(key, values)
  if values.kind == "int":
    return str(trial.suggest_int(key, int(values.low), int(values.high)))
  return f"{trial.suggest_float(key, values.low, values.high, log=values.kind == 'loguniform'):.3g}"


def short_keys(keys):
  """{KEY: label}: the last part of each key (learning_rate), or the whole key where last parts clash."""
  last = [key.rsplit(".", 1)[-1] for key in keys]
  return {key: (part if last.count(part) == 1 else key) for key, part in zip(keys, last)}


def trial_name(point):
  """'learning_rate=0.1,global_batch_size=64': readable, filesystem-safe, the same on every rerun. Characters
  other than letters, digits and ._+- become '_', and then a hash of the exact overrides keeps names unique."""
  labels = short_keys(list(point))
  exact = ",".join(f"{labels[key]}={value}" for key, value in point.items())
  safe = ",".join(f"{SAFE.sub('_', labels[key])}={SAFE.sub('_', str(value))}" for key, value in point.items())
  if safe == exact and len(exact) <= MAX_NAME:
    return exact
  digest = hashlib.sha1(repr(sorted(point.items())).encode()).hexdigest()[:8]
  return f"{safe[:MAX_NAME]}-{digest}"


def typed(value):
  """'0.1' -> 0.1, '64' -> 64, 'True' -> True, other text stays text (for HParams domains)."""
  try:
    parsed = ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return value
  return parsed if isinstance(parsed, (bool, int, float, str)) else value


def trials(grid, random_count=None, seed=0):
  """[{'index', 'name', 'overrides'}] for the grid, or `random_count` draws from it."""
  points = grid_points(grid) if random_count is None else random_points(grid, random_count, seed)
  return [{"index": i, "name": trial_name(p), "overrides": p} for i, p in enumerate(points)]
