"""Tracking: what the chief writes for TensorBoard and the workdir also goes to MLflow and/or Weights & Biases
(config keys tracking.*), sent by one background thread per tracker so that a slow or unreachable server never
holds up a train call.

  start(config, workdir, plan, task)   the chief's Trackers (None elsewhere, or when no tracker is configured)
  Trackers.metrics / params / tags     the values the writer writes (loops/persist/writers.py forwards them)
  Trackers.json_artifact / artifact    summary.json, best.json, the export
  Trackers.close(status)               waits up to tracking.close_timeout_seconds, then says what was not sent

Each tracker's run id is kept in workdir/tracking.json, so a resumed run (a requeue, a preemption, a rerun)
continues the same tracker run. A tracker that fails costs one warning line; its values are counted while it
is down (it is tried again every RETRY_SECONDS) and the end names how many were not sent.
"""

import importlib.util
import os
import posixpath
import queue
import shutil
import subprocess
import tempfile
import threading
import time

from absl import logging

from errors import ConfigError
from loops.persist import writers

FILE = "tracking.json"
KINDS = ("mlflow", "wandb")
RETRY_SECONDS = 60.0
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


MLFLOW_SCHEMES = ("file:", "sqlite:///", "http://", "https://", "databricks")


def check_settings(tracking):
  """ConfigError for a tracker setting no run could use (before anything is trained or written)."""
  for kind in KINDS:
    if not isinstance(tracking[kind], str):
      raise ConfigError(f"tracking.{kind} must be a string ('' = off), got {tracking[kind]!r}")
  if tracking.mlflow and not tracking.mlflow.startswith(MLFLOW_SCHEMES):
    raise ConfigError(f"tracking.mlflow '{tracking.mlflow}' is not an MLflow tracking URI; valid: "
                      "file:/abs/dir, sqlite:///abs/mlflow.db, http(s)://host:port, databricks, or '' (off)")
  if tracking.wandb and ("/" in tracking.wandb or len(tracking.wandb) > 128):
    raise ConfigError(f"tracking.wandb must be a W&B project name (no '/', at most 128 characters), got "
                      f"'{tracking.wandb}'")
  if not tracking.close_timeout_seconds >= 0:
    raise ConfigError(f"tracking.close_timeout_seconds must be >= 0, got {tracking.close_timeout_seconds}")
  for kind in configured_in(tracking):
    if importlib.util.find_spec(kind) is None:
      raise ConfigError(f"tracking.{kind} needs the {kind} package, which is not installed: "
                        "pip install -r requirements.txt")


def configured_in(tracking):
  """{kind: setting} of the trackers `tracking` (config.tracking) turns on."""
  return {kind: tracking[kind] for kind in KINDS if tracking[kind]}


def start(config, workdir, plan, task):
  """The chief's Trackers for this run (resuming the tracker runs recorded in the workdir), or None."""
  kinds = configured_in(config.tracking)
  if not kinds or not task.is_chief:
    return None
  recorded = writers.read_json(posixpath.join(workdir, FILE)) or {}
  trackers = Trackers(workdir, config.tracking.close_timeout_seconds, config.tracking.log_export)
  for kind, setting in kinds.items():
    previous = recorded.get(kind) or {}
    run_id = previous.get("run_id") if previous.get("setting") == setting else None
    trackers.add(kind, setting, _make(kind, config, workdir, setting), run_id)
  trackers.tags(run_tags(config, plan, task))
  trackers.params(writers.flatten(config))  # at every start: a value changed since is tagged 'changed.<key>'
  return trackers


def _make(kind, config, workdir, setting):
  run_name = posixpath.basename(workdir.rstrip("/"))
  if kind == "mlflow":
    from loops.persist import mlflow_tracker  # pylint: disable=import-outside-toplevel
    return mlflow_tracker.MlflowTracker(setting, config.tracking.experiment or experiment_of(workdir), run_name,
                                        config.tracking.parent_run)
  from loops.persist import wandb_tracker  # pylint: disable=import-outside-toplevel
  return wandb_tracker.WandbTracker(setting, run_name, config.tracking.group, workdir)


def experiment_of(workdir):
  """The default experiment: the name of the folder that holds the workdir (runs/r50 -> 'runs'; a sweep's trials
  -> the sweep directory's name)."""
  parent = posixpath.dirname(os.path.abspath(workdir) if "://" not in workdir else workdir.rstrip("/"))
  return posixpath.basename(parent) or "Default"


def run_tags(config, plan, task):
  """What a run is, for filtering in a tracker: task, strategy, replicas, workers, the git commit."""
  tags = {"task": config.task.name, "strategy": config.strategy, "replicas": str(plan.replicas),
          "workers": str(task.num_workers)}
  commit = git_commit()
  if commit:
    tags["git_commit"] = commit
  if config.sweep.settings:
    tags["sweep.settings"] = config.sweep.settings
  return tags


def git_commit():
  """The repository's HEAD commit (with '-dirty' when files changed), or None outside a git checkout."""
  try:
    head = subprocess.run(["git", "-C", REPOSITORY, "rev-parse", "HEAD"], capture_output=True, text=True,
                          timeout=10, check=True).stdout.strip()
    status = subprocess.run(["git", "-C", REPOSITORY, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return head + ("-dirty" if status else "") if head else None


class Trackers:
  """The configured trackers of a run, each behind its own Sender."""

  def __init__(self, workdir, close_timeout_seconds, log_export=False):
    self.workdir, self.close_timeout_seconds, self.log_export = workdir, close_timeout_seconds, log_export
    self.senders = []
    self._record_lock = threading.Lock()
    self._scratch = tempfile.mkdtemp(prefix="tracking-")

  def add(self, kind, setting, tracker, run_id):
    remember = lambda new_id: self._record(kind, setting, new_id)
    self.senders.append(Sender(kind, tracker, run_id, remember, setting))

  def _record(self, kind, setting, run_id):
    """Keeps the tracker's run id in workdir/tracking.json (from its sender's thread)."""
    with self._record_lock:
      path = posixpath.join(self.workdir, FILE)
      recorded = writers.read_json(path) or {}
      recorded[kind] = {"setting": setting, "run_id": run_id}
      writers.Writer(self.workdir).write_json(FILE, recorded)

  def metrics(self, step, values):
    stamp = int(time.time() * 1000)
    values = {tag: float(value) for tag, value in values.items()}
    self._send("metrics", step, values, stamp, count=len(values))

  def params(self, values):
    self._send("params", dict(values), count=len(values))

  def tags(self, values):
    self._send("tags", dict(values), count=len(values))

  def json_artifact(self, name, path):
    """A copy of workdir/name (just written at `path`) as an artifact: copied now, sent later."""
    copy = os.path.join(self._scratch, str(len(os.listdir(self._scratch))), name)
    os.makedirs(os.path.dirname(copy))
    writers.copy_file(path, copy)
    self._send("artifact", copy, "", count=1)

  def outcome(self, summary):
    """Tags of how the run ended: 'stopped_early' (its reason) and 'pruned' for a sweep trial its study pruned."""
    reason = summary.get("stopped_early")
    if reason:
      self.tags({"stopped_early": reason, **({"pruned": "true"} if str(reason).startswith("pruned") else {})})

  def export(self, path):
    """The export directory as artifacts under export/ (tracking.log_export; a local workdir only)."""
    if not self.log_export:
      return
    if "://" in path:
      logging.warning("tracking.log_export: the export at %s is not sent (only a local workdir's is)", path)
      return
    self._send("artifact", path, "export", count=1)

  def _send(self, method, *args, count):
    for sender in self.senders:
      sender.put(method, args, count)

  def close(self, status):
    """Ends every tracker run with `status` (FINISHED, KILLED, FAILED), waiting for what is queued at most
    close_timeout_seconds in all; one warning per tracker that could not send everything."""
    deadline = time.monotonic() + self.close_timeout_seconds
    for sender in self.senders:
      sender.put("finish", (status,), 0)
    for sender in self.senders:
      sender.close(max(0.0, deadline - time.monotonic()))
    shutil.rmtree(self._scratch, ignore_errors=True)

  def on_exit(self, error_type, error, traceback):
    """ExitStack.push: FINISHED after a normal end, KILLED after a preemption or Ctrl-C, else FAILED."""
    del error, traceback
    interrupted = error_type is not None and issubclass(error_type, (SystemExit, KeyboardInterrupt))
    self.close("FINISHED" if error_type is None else "KILLED" if interrupted else "FAILED")
    return False


class Sender:
  """One tracker's calls, made in order by a daemon thread. The first failure is one warning; while the tracker is
  down its calls are counted as not sent, and it is tried again every RETRY_SECONDS."""

  def __init__(self, kind, tracker, run_id, remember, setting=""):
    self.kind, self.tracker, self.run_id, self.remember, self.setting = kind, tracker, run_id, remember, setting
    self.opened = False
    self.not_sent, self.first_error, self.down_since = 0, None, None
    self.calls = queue.Queue()
    self.thread = threading.Thread(target=self._drain, name=f"tracking-{kind}", daemon=True)
    self.thread.start()

  def put(self, method, args, count):
    self.calls.put((method, args, count))

  def _drain(self):
    while True:
      method, args, count = self.calls.get()
      if method == "stop":
        return
      self._call(method, args, count)

  def _call(self, method, args, count):
    if self.down_since is not None and time.monotonic() - self.down_since < RETRY_SECONDS:
      self.not_sent += count
      return
    try:
      if not self.opened:
        self._open()
      getattr(self.tracker, method)(*args)
    except Exception as e:  # pylint: disable=broad-except
      self._failed(e, count)
      return
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
      self.not_sent += sum(count for _, _, count in _drained(self.calls))
      logging.warning("%s: still sending after %.0f s (tracking.close_timeout_seconds): %d values not sent",
                      self.kind, timeout, self.not_sent)
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
