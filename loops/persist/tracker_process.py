"""The tracker process: `python -m loops.persist.tracker_process`, started by the chief's Trackers
(loops/persist/tracking.py). It reads one JSON line per call on stdin and makes the calls, one thread per tracker
(so a slow one does not hold the other), and reports each tracker's run id as a JSON line on stdout. It imports no
TensorFlow, ignores SIGINT and SIGTERM (the run decides when tracking ends: its close line, or stdin's end when the
run's process is gone, kill -9 included) and exits after close_timeout seconds at most. A run id it cannot report
(the run's process is gone) it records in the run's tracking.json itself, so a resumed run continues that run.

A tracker that fails costs one warning line; while it is down its values are counted, it is tried again every
RETRY_SECONDS, and the end names how many were not sent.
"""

import json
import os
import queue
import signal
import sys
import threading
import time

from absl import flags
from absl import logging

RETRY_SECONDS = 60.0
BATCH_SECONDS = 1.0  # metrics calls queued within this are sent as one
MAX_POINTS = 100  # metrics calls per batch (each of a few values: under MLflow's 1000 metrics per request)


def make(kind, options):
  """The tracker object of `kind` (mlflow, wandb) from its options."""
  if kind == "mlflow":
    from loops.persist import mlflow_tracker  # pylint: disable=import-outside-toplevel
    return mlflow_tracker.MlflowTracker(**options)
  from loops.persist import wandb_tracker  # pylint: disable=import-outside-toplevel
  return wandb_tracker.WandbTracker(**options)


def serve(lines, report):
  """Makes the calls of `lines` (JSON strings) until a close line or their end (the run's process is gone: its
  trackers end KILLED within the close timeout their add line gave); report(kind, run_id)."""
  senders, timeout = [], 0.0
  for line in lines:
    message = json.loads(line)
    if message["op"] == "add":
      kind, timeout = message["kind"], message["close_timeout"]
      senders.append(Sender(kind, make(kind, message["options"]), message["run_id"],
                            lambda run_id, added=message: remember(report, added, run_id), message["setting"]))
    elif message["op"] == "close":
      return close_all(senders, message["status"], message["timeout"])
    else:
      for sender in senders:
        sender.put(message["op"], message["args"], message["count"])
  return close_all(senders, "KILLED", timeout)


def remember(report, added, run_id):
  """Reports the run id of the tracker `added` (its add message); when the run's process is gone (killed before
  the tracker opened its run: the report's pipe is closed), records it in the run's tracking.json here."""
  try:
    report(added["kind"], run_id)
  except OSError:
    record(added["record"], added["kind"], added["setting"], run_id, added["run_id"])


def record(path, kind, setting, run_id, continued):
  """Writes {kind: {setting, run_id}} into the JSON at path (a local workdir's: this process imports no
  TensorFlow, which writes the others) as the run's Trackers would have, unless a later run already recorded
  another id than the one this run continued."""
  if "://" in path:
    logging.warning("%s: run %s is not recorded in %s (the run's process is gone, and only it writes there): a "
                    "resumed run starts another", kind, run_id, path)
    return
  try:
    with open(path, encoding="utf-8") as f:
      recorded = json.load(f)
  except (OSError, ValueError):
    recorded = {}
  if (recorded.get(kind) or {}).get("run_id") not in (None, continued):
    return
  recorded[kind] = {"setting": setting, "run_id": run_id}
  try:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.write(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)
  except OSError as e:
    logging.warning("%s: run %s is not recorded in %s (%s): a resumed run starts another", kind, run_id, path, e)


def close_all(senders, status, timeout):
  """Ends every tracker run with `status`, waiting for what is queued at most `timeout` seconds in all."""
  deadline = time.monotonic() + timeout
  for sender in senders:
    sender.put("finish", (status,), 0)
  for sender in senders:
    sender.close(max(0.0, deadline - time.monotonic()))


class Sender:
  """One tracker's calls, made in order by a daemon thread. The first failure is one warning; while the tracker is
  down its calls are counted as not sent, and it is tried again every RETRY_SECONDS."""

  def __init__(self, kind, tracker, run_id, remember, setting=""):
    self.kind, self.tracker, self.run_id, self.remember, self.setting = kind, tracker, run_id, remember, setting
    self.opened = False
    self.last_metrics = -BATCH_SECONDS
    self.in_flight = 0  # the values of the call being made
    self.not_sent, self.first_error, self.down_since = 0, None, None
    self.calls = queue.Queue()
    self.thread = threading.Thread(target=self._drain, name=f"tracking-{kind}", daemon=True)
    self.thread.start()

  def put(self, method, args, count):
    self.calls.put((method, args, count))

  def _drain(self):
    pending = None
    while True:
      method, args, count = pending or self.calls.get()
      pending = None
      if method == "stop":
        return
      if method == "metrics":
        args, count, pending = self._metrics_batch(args, count)
      self._call(method, args, count)

  def _metrics_batch(self, first, count):
    """([points], count, the next call or None): the metrics calls queued one after another, made as one call at
    most every BATCH_SECONDS (a tracker's cost per call, e.g. a database transaction, is paid once per batch)."""
    time.sleep(max(0.0, self.last_metrics + BATCH_SECONDS - time.monotonic()))
    self.last_metrics = time.monotonic()
    points = [tuple(first)]
    while len(points) < MAX_POINTS:
      try:
        method, args, more = self.calls.get_nowait()
      except queue.Empty:
        return (points,), count, None
      if method != "metrics":
        return (points,), count, (method, args, more)
      points.append(tuple(args))
      count += more
    return (points,), count, None

  def _call(self, method, args, count):
    if self.down_since is not None and time.monotonic() - self.down_since < RETRY_SECONDS:
      self.not_sent += count
      return
    self.in_flight = count
    try:
      if not self.opened:
        self._open()
      getattr(self.tracker, method)(*args)
    except Exception as e:  # pylint: disable=broad-except
      self._failed(e, count)
      return
    finally:
      self.in_flight = 0
    if self.down_since is not None:
      logging.warning("%s: reachable again (%d values not sent while it was down)", self.kind, self.not_sent)
      self.down_since = None

  def _open(self):
    run_id = self.tracker.open(self.run_id)
    if run_id != self.run_id:
      self.remember(run_id)
    self.run_id, self.opened = run_id, True

  def _failed(self, error, count):
    self.not_sent += count
    self.down_since = time.monotonic()
    if self.first_error is None:
      self.first_error = describe(error)
      logging.warning("%s: %s%s; training goes on (what it cannot send is counted, and it is tried again every "
                      "%.0f s)", self.kind, f"{self.setting}: " if self.setting else "", self.first_error,
                      RETRY_SECONDS)

  def close(self, timeout):
    self.calls.put(("stop", (), 0))
    self.thread.join(timeout)
    if self.thread.is_alive():
      self.not_sent += self.in_flight + sum(count for _, _, count in _drained(self.calls))
      logging.warning("%s: still sending after %.0f s (tracking.close_timeout_seconds): %d values not sent",
                      self.kind, timeout, self.not_sent)
    elif self.not_sent and self.down_since is None:  # it came back: the outage is what lost them, not the end
      logging.warning("%s: %d values not sent while it was down (%s); it took every value since it came back",
                      self.kind, self.not_sent, self.first_error)
    elif self.not_sent:
      logging.warning("%s: %d values not sent (%s)", self.kind, self.not_sent, self.first_error)


def _drained(calls):
  items = []
  while True:
    try:
      items.append(calls.get_nowait())
    except queue.Empty:
      return items


UNREACHABLE = ("Connection refused", "NewConnectionError", "Max retries exceeded", "Name or service not known",
               "timed out")


def describe(error):
  """'unreachable (connection refused, timed out, ...)' for a server that does not answer, else the error's type
  and first line."""
  text = str(error)
  if isinstance(error, (ConnectionError, TimeoutError)) or any(mark in text for mark in UNREACHABLE):
    return "not reachable (" + next((mark for mark in UNREACHABLE if mark in text), type(error).__name__) + ")"
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return f"{type(error).__name__}: " + (lines[0] if lines else "")[:300]


def main():
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
  protocol = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)  # whatever a tracker library prints goes to the run's stderr, not into the protocol
  sys.stdout = sys.stderr
  flags.FLAGS(sys.argv[:1])  # absl logs as in the run (no "logging before flag parsing" line)
  logging.use_absl_handler()

  def report(kind, run_id):
    protocol.write(json.dumps({"kind": kind, "run_id": run_id}) + "\n")
    protocol.flush()

  serve(sys.stdin, report)
  os._exit(0)  # a tracker's thread still blocked (close_timeout reached) must not hold the exit


if __name__ == "__main__":
  main()
