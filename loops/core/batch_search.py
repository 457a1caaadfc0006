"""The batch-size search, as pure Python: doubling until a size does not fit, then a binary search between the
last size that fitted and the first that did not (loops/finders/batch_size.py supplies `fits`)."""

import dataclasses
from typing import Callable, List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class SearchResult:
  largest: int  # the largest size that fitted; 0 when not even the smallest did
  tried: List[Tuple[int, bool]]  # (size, fitted) in the order tried
  first_failure: Optional[int]  # the smallest size seen not to fit; None when none failed (it hit `maximum`)


def largest_fitting(fits: Callable[[int], bool], start: int, maximum: int, granularity: int = 1) -> SearchResult:
  """The largest multiple of `granularity` in [start, maximum] for which fits(size) is True, assuming that a
  size fits whenever a larger one does.

  Sizes tried: start, 2 x start, 4 x start, ... (the last one capped at maximum) until one does not fit, then
  halving the interval between the last fit and the first failure, in multiples of granularity. Each size is
  tried once. A start that does not fit is bisected down towards granularity.
  """
  if granularity < 1 or start < granularity or start % granularity or maximum < start:
    raise ValueError(f"need 1 <= granularity <= start <= maximum, start a multiple of granularity; got "
                     f"granularity={granularity}, start={start}, maximum={maximum}")
  top = maximum - maximum % granularity
  tried = []

  def attempt(size):
    fitted = bool(fits(size))
    tried.append((size, fitted))
    return fitted

  fitted, failed, size = 0, 0, start
  while True:
    if not attempt(size):
      failed = size
      break
    fitted = size
    if size == top:
      return SearchResult(largest=fitted, tried=tried, first_failure=None)
    size = min(size * 2, top)
  low, high = fitted // granularity, failed // granularity  # in units of granularity: low fits (0: none), high not
  while high - low > 1:
    middle = (low + high) // 2
    if attempt(middle * granularity):
      low = middle
    else:
      high = middle
  return SearchResult(largest=low * granularity, tried=tried, first_failure=high * granularity)
