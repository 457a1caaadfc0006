"""The trials of a sweep: `--grid KEY=V1,V2` specs, the full grid or N reproducible random draws, trial names.

Pure Python (no TensorFlow, nothing of ours). A value is passed to main.py as `--config.KEY=VALUE`, exactly as
written. A random sweep (`--random N --seed S`) may also give ranges instead of values:
`KEY=loguniform:LOW:HIGH`, `KEY=uniform:LOW:HIGH` (floats, drawn then rounded to 3 significant digits, so the
name and the value agree) and `KEY=int:LOW:HIGH` (integers, both ends included).
"""

import ast
import hashlib
import itertools
import math
import random
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

  def draw(self, rng):
    if self.kind == "int":
      return str(rng.randint(int(self.low), int(self.high)))
    if self.kind == "loguniform":
      value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
    else:
      value = rng.uniform(self.low, self.high)
    return f"{value:.3g}"

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
  """Every combination, the first key varying slowest: [{KEY: value}, ...]."""
  ranged = [key for key, values in grid.items() if isinstance(values, Range)]
  if ranged:
    raise SweepError(f"--grid {ranged[0]}={grid[ranged[0]]!r} is a range: ranges need --random N --seed S")
  return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def random_points(grid, count, seed):
  """`count` distinct points drawn with random.Random(seed): the same points on every rerun."""
  if count < 1:
    raise SweepError(f"--random must be >= 1, got {count}")
  rng = random.Random(seed)
  if not any(isinstance(values, Range) for values in grid.values()):
    points = grid_points(grid)
    if count > len(points):
      raise SweepError(f"--random {count}: the grid has only {len(points)} points; use fewer or add values")
    return [points[i] for i in rng.sample(range(len(points)), count)]
  points, names = [], set()
  for _ in range(100 * count):
    point = {key: values.draw(rng) if isinstance(values, Range) else rng.choice(values)
             for key, values in grid.items()}
    name = trial_name(point)
    if name not in names:
      names.add(name)
      points.append(point)
      if len(points) == count:
        return points
  raise SweepError(f"--random {count}: only {len(points)} distinct points could be drawn; widen the ranges")


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
