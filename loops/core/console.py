"""What a person sees in a terminal: one live progress bar on the last line, every other line printed above it.

`LiveBar` draws the bar on stdout in place (a carriage return, never wider than the terminal, so it never wraps).
While it is drawn, sys.stdout, sys.stderr and absl's log handler write through `_AboveTheBar`: a line first erases
the bar, so log lines (evals, saves, warnings, from any thread) start at the left margin and the bar comes back at
the next train call. Pure Python apart from absl's handler.
"""

import logging as python_logging
import shutil
import sys
import threading

from absl import logging

FILLED, EMPTY = "━", "─"
ERASE_LINE = "\r\033[K"


class LiveBar:
  """A Keras-style bar: `550/1100 ━━━━━━━━━━────────── ETA 0:02 5ms/step - loss: 0.0004474 - epoch 25.0/50`.

  Args:
    total_steps: the run's last step.
    stream: the terminal (default: sys.stdout as it is when the bar is made).
  """

  def __init__(self, total_steps, stream=None):
    self.total_steps = total_steps
    self.stream = stream or sys.stdout
    self.lock = threading.RLock()
    self.drawn = False  # the bar is on the terminal's current line, the cursor at its end
    self._restore = _write_above(self)

  def update(self, step, timing="", details=()):
    """Draws the bar at `step`, then `timing` and `details` (strings, ' - ' between them); at the last step the
    bar stays, with a newline."""
    with self.lock:
      width = max(20, shutil.get_terminal_size().columns - 1)
      text = " - ".join([f"{self._bar(step)} {timing}".rstrip(), *details])[:width]
      self.stream.write(f"{ERASE_LINE}{text}")
      self.drawn = True
      if step >= self.total_steps:
        self.stream.write("\n")
        self.drawn = False
      self.stream.flush()

  def erase(self):
    """Erases the bar from its line (before another line is written there)."""
    with self.lock:
      if self.drawn:
        self.stream.write(ERASE_LINE)
        self.stream.flush()
        self.drawn = False

  def close(self):
    """Erases a bar left unfinished and gives the streams back."""
    self.erase()
    self._restore()

  def _bar(self, step):
    digits = len(str(self.total_steps))
    done = int(20 * min(step, self.total_steps) / max(self.total_steps, 1))
    return f"{step:>{digits}}/{self.total_steps} {FILLED * done}{EMPTY * (20 - done)}"


class _AboveTheBar:
  """A text stream that erases the bar before it writes: whatever is printed starts at the left margin."""

  def __init__(self, stream, bar):
    self._stream, self._bar = stream, bar

  def write(self, text):
    with self._bar.lock:
      self._bar.erase()
      return self._stream.write(text)

  def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...
    return getattr(self._stream, name)


def _write_above(bar):
  """Routes sys.stdout, sys.stderr and absl's handler through _AboveTheBar; returns the function that undoes it."""
  handler = logging.get_absl_handler().python_handler
  saved = sys.stdout, sys.stderr, handler.stream
  sys.stdout, sys.stderr = _AboveTheBar(sys.stdout, bar), _AboveTheBar(sys.stderr, bar)
  if handler.stream is saved[1]:
    handler.stream = sys.stderr

  def restore():
    if isinstance(sys.stdout, _AboveTheBar):
      sys.stdout, sys.stderr = saved[0], saved[1]
    if isinstance(handler.stream, _AboveTheBar):
      handler.stream = saved[2]
  return restore


class TerminalFormatter(python_logging.Formatter):
  """Log lines for a person at a terminal: the message alone, `warning: ` / `error: ` before the others'.
  (Logs and SLURM keep absl's prefix: level, time, thread, file:line.)"""

  PREFIX = {"WARNING": "warning: ", "ERROR": "error: ", "CRITICAL": "error: "}

  def format(self, record):
    text = self.PREFIX.get(record.levelname, "") + record.getMessage()
    if record.exc_info:
      text += "\n" + self.formatException(record.exc_info)
    return text


def is_terminal():
  """stdout and stderr are both a terminal (a person watches; not a log file, a pipe or SLURM)."""
  return sys.stdout.isatty() and sys.stderr.isatty()
