"""A bound on every wait for the tf.data service while a train call runs (data/service.py marks each batch's
arrival). TensorFlow waits for a lost data worker or dispatcher without a bound, and its wait does not return to
Python, so neither a timeout nor SIGTERM could end it: a thread watches instead.

While a train call runs (`train_call_watch`), the run ends with one line and the preemption exit code (a rerun
resumes from the last checkpoint) when
- no batch came for data.service_timeout_seconds, or
- a signal (preemption.signals, Ctrl-C) came (during the call, or between calls) and no batch for max(10 s, 3 x the
  longest gap between batches seen so far): the input is stuck, so the save at the end of the call would never come.
"""

import contextlib
import os
import sys
import threading
import time

from data import service
from loops.persist import preemption

SIGNAL_GRACE_SECONDS = 10.0


class ServiceWatch:
  """The watching thread of one run (one per process while a train call runs)."""

  def __init__(self, address, timeout_seconds, exit_code, poll_seconds=0.5):
    self.address, self.timeout, self.exit_code, self.poll = address, timeout_seconds, exit_code, poll_seconds
    self.signal_name = None
    self._since = time.monotonic()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name="data-service-watch")

  def __enter__(self):
    self._since = time.monotonic()
    service.ARRIVALS.interrupted = None
    preemption.SIGNAL_LISTENERS.append(self.on_signal)
    if preemption.RECEIVED:  # it came between calls (the save at the end of this call is still to come)
      self.on_signal(preemption.RECEIVED[0])
    self._thread.start()
    return self

  def __exit__(self, *_):
    self._stop.set()
    preemption.SIGNAL_LISTENERS.remove(self.on_signal)
    self._thread.join()

  def on_signal(self, name):
    if self.signal_name is None:
      self.signal_name = name
      service.ARRIVALS.interrupted = name  # a probe of the dispatcher in Python stops at once

  def waited(self):
    """Seconds since the last batch arrived (or since the call began, when later)."""
    with service.ARRIVALS.lock:
      last = max(service.ARRIVALS.last or 0.0, self._since)
    return time.monotonic() - last

  def _run(self):
    while not self._stop.wait(self.poll):
      if service.ARRIVALS.probing:
        self._since = time.monotonic()  # the dispatcher's probe has its own bound and hears signals
        continue
      waited = self.waited()
      if waited > self.timeout:
        self._end(f"no batch from the tf.data service at {self.address} for {waited:.0f} s "
                  f"(data.service_timeout_seconds={self.timeout:g})")
      grace = max(SIGNAL_GRACE_SECONDS, 3 * service.ARRIVALS.longest_gap)
      if self.signal_name and waited > grace:
        self._end(f"{self.signal_name} while the train input waited {waited:.0f} s for the tf.data service at "
                  f"{self.address}", preemption.INTERRUPTED_EXIT_CODE if self.signal_name == "SIGINT" else None)

  def _end(self, what, code=None):
    where = ("nothing listens there (the dispatcher is gone)" if not service.reachable(self.address) else
             "the dispatcher answers but sends no batches (a data worker lost, or none registered)")
    code = self.exit_code if code is None else code
    sys.stderr.write(f"error: {what}: {where}; exiting with code {code} without a save: rerun to resume from the "
                     "last checkpoint\n")
    sys.stderr.flush()
    os._exit(code)  # the main thread is inside TensorFlow's wait, which Python cannot interrupt


def train_call_watch(service, timeout_seconds, exit_code):
  """A context factory for each train call: a ServiceWatch when data.service (`service`) is set, else nothing
  (data.service_timeout_seconds, preemption.exit_code)."""
  if not service:
    return contextlib.nullcontext
  return lambda: ServiceWatch(service, timeout_seconds, exit_code)
