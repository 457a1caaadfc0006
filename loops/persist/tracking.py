"""Tracking: what the chief writes for TensorBoard and the workdir also goes to MLflow and/or Weights & Biases
(config keys tracking.*), through a process of its own (loops/persist/tracker_process.py), so that a slow,
unreachable or crashing tracker never holds up, slows or ends a train call.

  check_settings(config.tracking)      before anything is trained or written
  start(tracking, tags, params, workdir, role)  the chief's Trackers (None elsewhere, or when none is configured)
  start_evaluator(tracking, task_name, params, workdir)  the sidecar evaluator's: a run of its own beside the
                                                          training's
  Trackers.metrics / params / tags     the values the writer writes (loops/persist/writers.py forwards them)
  Trackers.json_artifact / export      summary.json, best.json, the export
  Trackers.close(status)               the tracker process sends what is queued (at most close_timeout_seconds)

Each tracker's run id is kept in workdir/tracking.json, so a resumed run (a requeue, a preemption, a rerun)
continues the same tracker run.
"""

import importlib.util
import json
import os
import posixpath
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from absl import logging

from errors import ConfigError
from loops.persist import writers

FILE = "tracking.json"
KINDS = ("mlflow", "wandb")
GRACE_SECONDS = 15.0  # how long after its close timeout the tracker process is waited for before it is stopped
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


MLFLOW_SCHEMES = ("file:", "sqlite:///", "http://", "https://", "databricks")
FILE_STORE_ALLOWED = "MLFLOW_ALLOW_FILE_STORE"  # MLflow's own opt-in to its filesystem backend (maintenance mode)


def check_settings(tracking):
  """ConfigError for a tracker setting no run could use (before anything is trained or written)."""
  for kind in KINDS:
    if not isinstance(tracking[kind], str):
      raise ConfigError(f"tracking.{kind} must be a string ('' = off), got {tracking[kind]!r}")
  if tracking.mlflow and not tracking.mlflow.startswith(MLFLOW_SCHEMES):
    raise ConfigError(f"tracking.mlflow '{tracking.mlflow}' is not an MLflow tracking URI; valid: "
                      "sqlite:///abs/mlflow.db, http(s)://host:port, databricks, or '' (off)")
  if tracking.mlflow.startswith("file:") and os.environ.get(FILE_STORE_ALLOWED, "").lower() != "true":
    raise ConfigError(f"tracking.mlflow '{tracking.mlflow}': MLflow refuses to write a file store (its filesystem "
                      "backend is in maintenance mode), so every value would be lost; use sqlite:///abs/mlflow.db "
                      f"(`mlflow migrate-filestore` moves an existing store), or set {FILE_STORE_ALLOWED}=true to "
                      "write the file store anyway")
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
  """{kind: setting} of the trackers `tracking` (the tracking settings) turns on."""
  return {kind: getattr(tracking, kind) for kind in KINDS if getattr(tracking, kind)}


def start(tracking, tags, params, workdir, role):
  """The chief's Trackers for this run (resuming the tracker runs recorded in the workdir), or None.

  tracking: the tracking settings; tags: `run_tags`; params: the flattened config (writers.flatten)."""
  kinds = configured_in(tracking)
  if not kinds or not role.is_chief:
    return None
  recorded = writers.read_json(posixpath.join(workdir, FILE)) or {}
  trackers = Trackers(workdir, tracking.close_timeout_seconds, tracking.log_export)
  for kind, setting in kinds.items():
    previous = recorded.get(kind) or {}
    run_id = previous.get("run_id") if previous.get("setting") == setting else None
    trackers.add(kind, setting, _options(kind, tracking, workdir, setting), run_id)
  trackers.tags(tags)
  trackers.params(params)  # at every start: a value changed since is tagged 'changed.<key>'
  return trackers


EVALUATOR_SUFFIX = "-evaluator"


def start_evaluator(tracking, task_name, params, workdir):
  """The sidecar evaluator's Trackers (None when no tracker is configured): a tracker run of its own, named after
  the workdir + EVALUATOR_SUFFIX (MLflow: a child of the training's run when workdir/tracking.json names it; W&B: in
  the sweep's group, else in a group named after the workdir, beside the training's run). Its run ids are kept in
  workdir/eval/tracking.json, so a restarted evaluator continues its run. Two processes never write one run.
  tracking: the tracking settings; params: the flattened config (writers.flatten)."""
  kinds = configured_in(tracking)
  if not kinds:
    return None
  eval_dir = posixpath.join(workdir, "eval")
  recorded = writers.read_json(posixpath.join(eval_dir, FILE)) or {}
  training = writers.read_json(posixpath.join(workdir, FILE)) or {}
  trackers = Trackers(eval_dir, tracking.close_timeout_seconds)
  for kind, setting in kinds.items():
    options = _options(kind, tracking, workdir, setting)
    options["run_name"] += EVALUATOR_SUFFIX
    trained = training.get(kind) or {}
    if kind == "mlflow" and trained.get("setting") == setting:
      options["parent_run"] = trained["run_id"]
    if kind == "wandb":
      options["group"] = options["group"] or posixpath.basename(workdir.rstrip("/"))
      options["workdir"] = eval_dir
    previous = recorded.get(kind) or {}
    trackers.add(kind, setting, options, previous.get("run_id") if previous.get("setting") == setting else None)
  commit = git_commit()
  trackers.tags({"task": task_name, "role": "evaluator", **({"git_commit": commit} if commit else {})})
  trackers.params(params)
  return trackers


def _options(kind, tracking, workdir, setting):
  """The keyword arguments of the tracker's class (tracker_process.KINDS)."""
  run_name = posixpath.basename(workdir.rstrip("/"))
  if kind == "mlflow":
    return {"uri": setting, "experiment": tracking.experiment or experiment_of(workdir), "run_name": run_name,
            "parent_run": tracking.parent_run}
  return {"project": setting, "run_name": run_name, "group": tracking.group, "workdir": workdir}


def experiment_of(workdir):
  """The default experiment: the name of the folder that holds the workdir (runs/r50 -> 'runs'; a sweep's trials
  -> the sweep directory's name)."""
  parent = posixpath.dirname(os.path.abspath(workdir) if "://" not in workdir else workdir.rstrip("/"))
  return posixpath.basename(parent) or "Default"


def run_tags(task, run, sweep, plan, role):
  """What a run is, for filtering in a tracker: task, strategy, replicas, workers, the git commit (`task`, `run`,
  `sweep`: those settings sections)."""
  tags = {"task": task.name, "strategy": run.strategy, "replicas": str(plan.replicas),
          "workers": str(role.num_workers)}
  commit = git_commit()
  if commit:
    tags["git_commit"] = commit
  if sweep.settings:
    tags["sweep.settings"] = sweep.settings
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
  """The run's side of tracking: every call is a line queued for the tracker process (loops/persist/
  tracker_process.py, started here), written to its stdin by a thread of its own. The run never waits for a
  tracker, nor shares its interpreter with one: MLflow's and W&B's imports, SQL and HTTP run in that process."""

  def __init__(self, workdir, close_timeout_seconds, log_export=False):
    self.workdir, self.close_timeout_seconds, self.log_export = workdir, close_timeout_seconds, log_export
    self.specs = {}
    self._scratch = tempfile.mkdtemp(prefix="tracking-")
    self.process = subprocess.Popen([sys.executable, "-m", "loops.persist.tracker_process"], cwd=REPOSITORY,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.lines = queue.Queue()
    self.writer = threading.Thread(target=self._write_lines, name="tracking-writer", daemon=True)
    self.reader = threading.Thread(target=self._read_run_ids, name="tracking-reader", daemon=True)
    self.writer.start()
    self.reader.start()

  def add(self, kind, setting, options, run_id):
    """A tracker (`options`: the keyword arguments of its class in tracker_process.KINDS), continuing run_id."""
    self.specs[kind] = setting
    self._put({"op": "add", "kind": kind, "setting": setting, "options": options, "run_id": run_id,
               "record": posixpath.join(self.workdir, FILE), "close_timeout": self.close_timeout_seconds})

  def _put(self, message):
    self.lines.put(json.dumps(message) + "\n")

  def _write_lines(self):
    while True:
      line = self.lines.get()
      try:
        self.process.stdin.write(line)
        self.process.stdin.flush()
      except (OSError, ValueError):  # the tracker process is gone: its own last lines said why
        return
      if line.startswith('{"op": "close"'):
        self.process.stdin.close()
        return

  def _read_run_ids(self):
    """Keeps each tracker's run id in workdir/tracking.json as the tracker process reports it."""
    for line in self.process.stdout:
      reported = json.loads(line)
      path = posixpath.join(self.workdir, FILE)
      recorded = writers.read_json(path) or {}
      recorded[reported["kind"]] = {"setting": self.specs[reported["kind"]], "run_id": reported["run_id"]}
      writers.Writer(self.workdir).write_json(FILE, recorded)

  def metrics(self, step, values):
    values = {tag: float(value) for tag, value in values.items()}
    self._put({"op": "metrics", "args": [step, values, int(time.time() * 1000)], "count": len(values)})

  def params(self, values):
    self._put({"op": "params", "args": [values], "count": len(values)})

  def tags(self, values):
    self._put({"op": "tags", "args": [values], "count": len(values)})

  def json_artifact(self, name, path):
    """A copy of workdir/name (just written at `path`) as an artifact: copied now, sent later."""
    copy = os.path.join(self._scratch, str(len(os.listdir(self._scratch))), name)
    os.makedirs(os.path.dirname(copy))
    writers.copy_file(path, copy)
    self._put({"op": "artifact", "args": [copy, ""], "count": 1})

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
    self._put({"op": "artifact", "args": [path, "export"], "count": 1})

  def close(self, status):
    """Ends every tracker run with `status` (FINISHED, KILLED, FAILED): the tracker process sends what is queued
    for at most close_timeout_seconds, says what it could not send, and exits."""
    self._put({"op": "close", "status": status, "timeout": self.close_timeout_seconds})
    try:
      self.process.wait(self.close_timeout_seconds + GRACE_SECONDS)
    except subprocess.TimeoutExpired:
      self.process.kill()
      logging.warning("tracking: the tracker process did not end %.0f s after the run; stopped", GRACE_SECONDS)
    self.reader.join(GRACE_SECONDS)
    shutil.rmtree(self._scratch, ignore_errors=True)

  def on_exit(self, error_type, error, traceback):
    """ExitStack.push: FINISHED after a normal end, KILLED after a preemption or Ctrl-C, else FAILED."""
    del error, traceback
    interrupted = error_type is not None and issubclass(error_type, (SystemExit, KeyboardInterrupt))
    self.close("FINISHED" if error_type is None else "KILLED" if interrupted else "FAILED")
    return False
