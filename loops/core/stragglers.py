"""Straggling workers: the scalars of each call's per-worker busy times, and the warning for a worker that stays
slower than the others. Pure Python."""

import statistics


def time_scalars(worker_seconds):
  """{train/slowest_worker_seconds, train/worker_time_spread}: the slowest worker's busy seconds in the call and
  how much slower it was than the median worker (slowest / median - 1; 0.25 = 25 % slower)."""
  slowest, median = max(worker_seconds), statistics.median(worker_seconds)
  return {"train/slowest_worker_seconds": slowest,
          "train/worker_time_spread": slowest / median - 1.0 if median > 0 else 0.0}


class StragglerWatch:
  """Names a worker that was more than `fraction` slower than the median for `calls` calls in a row.

  `observe(worker_seconds)` returns the warning line once per streak (again only after the worker recovered),
  else None."""

  def __init__(self, fraction, calls):
    self.fraction, self.calls = fraction, calls
    self.streaks, self.warned, self.ever_warned = {}, set(), set()

  def observe(self, worker_seconds):
    if len(worker_seconds) < 2 or self.fraction <= 0:
      return None
    median = statistics.median(worker_seconds)
    line = None
    for task, seconds in enumerate(worker_seconds):
      slower = median > 0 and seconds > median * (1 + self.fraction)
      self.streaks[task] = self.streaks.get(task, 0) + 1 if slower else 0
      if not slower:
        self.warned.discard(task)
      elif self.streaks[task] >= self.calls and task not in self.warned and line is None:
        self.warned.add(task)
        self.ever_warned.add(task)
        line = (f"worker {task} is straggling: {seconds / median - 1:.0%} slower than the median worker "
                f"({seconds:.3f} s vs {median:.3f} s of work per train call) for {self.streaks[task]} calls in a "
                f"row; every synchronous step waits for it")
    return line
