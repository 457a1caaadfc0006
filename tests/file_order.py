"""Longest test files first, so that the suite's xdist workers (`--dist loadfile`, one file per worker at a
time) end together instead of one worker running a long file alone at the end.

Each file's cost is its measured seconds in tests/file_durations.json (setup + call + teardown of all its tests);
`python -m pytest --record-file-durations` measures the suite and rewrites it. A file not measured yet goes first.
"""

import json
import os

DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_durations.json")


def file_of(nodeid):
  return nodeid.split("::", 1)[0]


def load(path=DURATIONS):
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def longest_first(items, seconds):
  """Reorders pytest items in place: files by measured seconds (unmeasured first), each file's tests in their
  order."""
  unmeasured = float("inf")
  items.sort(key=lambda item: -seconds.get(file_of(item.nodeid), unmeasured))


class Recorder:
  """Sums each file's test report durations; writes them (rounded, sorted by name) at the end of the session."""

  def __init__(self, path=DURATIONS):
    self.path = path
    self.seconds = {}

  def add(self, nodeid, duration):
    name = file_of(nodeid)
    self.seconds[name] = self.seconds.get(name, 0.0) + duration

  def write(self):
    with open(self.path, "w") as f:
      json.dump({name: round(s, 1) for name, s in sorted(self.seconds.items())}, f, indent=1)
      f.write("\n")
