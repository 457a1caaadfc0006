"""MlflowTracker: one MLflow run per workdir through MLflow's own client (a file:/sqlite: store or an http://
tracking server). Its methods run in the tracking thread (loops/persist/tracking.py), never in a train call."""

import contextlib
import fcntl
import logging as python_logging
import os
import sqlite3
import time

# A server that is down or slow answers within seconds, not after MLflow's default of 7 retries over minutes
# (a value the user set wins).
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a parameter's value
BATCH = 100  # params or tags per log_batch (MLflow takes at most 100 params)
MAX_METRICS = 1000  # metrics per log_batch (MLflow's limit)
# MLflow's start-up chatter (database migrations) and urllib3's retry warnings: the tracker's one warning says it.
NOISY_LOGGERS = {"alembic": python_logging.WARNING, "mlflow": python_logging.WARNING,
                 "mlflow.store.db.utils": python_logging.ERROR,  # a retry's multi-line block: the tracker's line says it
                 "urllib3.connectionpool": python_logging.ERROR}


class MlflowTracker:
  """A run in experiment `experiment` named `run_name` (a child of `parent_run` when a sweep set it)."""

  def __init__(self, uri, experiment, run_name, parent_run=""):
    self.uri, self.experiment, self.run_name, self.parent_run = uri, experiment, run_name, parent_run
    self.client = self.run_id = None
    self.known_params = {}
    self.logged = {}  # {metric key: the last step an earlier attempt of this run logged}
    self.replayed = None  # the first step this attempt did not send again, once one is met

  def open(self, run_id):
    """Continues run_id when the store still holds it, else starts a run; returns its id."""
    with store_created(self.uri):
      self.client = client(self.uri)
      self.client.search_experiments(max_results=1)  # makes the store (a new database's tables) now
    if run_id and _exists(self.client, run_id):
      self.run_id = run_id
      self.client.update_run(run_id, status="RUNNING")
      data = self.client.get_run(run_id).data
      self.known_params = dict(data.params)
      self.logged = {key: max(m.step for m in self.client.get_metric_history(run_id, key)) for key in data.metrics}
      return run_id
    tags = {"mlflow.runName": self.run_name}
    if self.parent_run:
      tags["mlflow.parentRunId"] = self.parent_run
    run = self.client.create_run(experiment_id(self.client, self.experiment, self.uri), run_name=self.run_name,
                                 tags=tags)
    self.run_id = run.info.run_id
    return self.run_id

  def params(self, values):
    """New parameters as params; a value that changed since an earlier start (MLflow keeps a param's first value)
    as the tag 'changed.<key>'."""
    from mlflow.entities import Param, RunTag  # pylint: disable=import-outside-toplevel

    values = {key: str(value)[:MAX_PARAM_LENGTH] for key, value in values.items()}
    new = {k: v for k, v in values.items() if k not in self.known_params}
    changed = {f"changed.{k}": v for k, v in values.items() if k in self.known_params and self.known_params[k] != v}
    items = list(new.items())
    for start in range(0, len(items), BATCH):
      self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in items[start:start + BATCH]])
    self.known_params.update(new)
    if changed:
      self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in changed.items()])

  def metrics(self, points):
    """points: [(step, {tag: value}, timestamp in ms)], sent in requests of at most 1000 values. A step an earlier
    attempt of the run already logged (it crashed after them, before a checkpoint held them: this attempt trains
    them again) is not sent twice; the tag 'replayed_steps' says which steps hold the crashed attempt's values."""
    from mlflow.entities import Metric, RunTag  # pylint: disable=import-outside-toplevel

    metrics = [Metric(key, value, timestamp, step) for step, values, timestamp in points
               for key, value in values.items() if step > self.logged.get(key, -1)]
    skipped = [step for step, values, _ in points if any(step <= self.logged.get(key, -1) for key in values)]
    if skipped and self.replayed is None:
      self.replayed = min(skipped)
      last = max(self.logged.values())
      self.client.log_batch(self.run_id, tags=[RunTag("replayed_steps", (
          f"{self.replayed}-{last}: logged by an attempt that ended before a checkpoint held them (kill -9, a "
          f"crash); the run resumed from its last checkpoint and trained them again, not sent twice"))])
    for start in range(0, len(metrics), MAX_METRICS):
      self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_METRICS])

  def tags(self, values):
    from mlflow.entities import RunTag  # pylint: disable=import-outside-toplevel

    self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in values.items()])

  def artifact(self, path, folder):
    if os.path.isdir(path):
      self.client.log_artifacts(self.run_id, path, folder or None)
    else:
      self.client.log_artifact(self.run_id, path, folder or None)

  def finish(self, status):
    self.client.set_terminated(self.run_id, status=status, end_time=int(time.time() * 1000))


def client(uri):
  """MLflow's client for `uri`, with MLflow's own start-up chatter (database migrations) kept out of the log."""
  for name, value in HTTP_DEFAULTS.items():
    os.environ.setdefault(name, value)
  from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel

  for name, level in NOISY_LOGGERS.items():  # after the import: MLflow sets its own logger's level when imported
    python_logging.getLogger(name).setLevel(level)
  return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def store_created(uri):
  """Inside: no other process making the same sqlite store (MLflow creates a new database's tables without a lock:
  a second run starting beside the first failed with 'duplicate column name' and recorded nothing)."""
  if not uri.startswith("sqlite:///"):
    yield
    return
  database = os.path.abspath(uri[len("sqlite:///"):])
  with open(database + ".lock", "a", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      _openable(database)
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _openable(database):
  """OSError in one line when sqlite cannot open `database` (MLflow would retry for ~50 s, logging each try)."""
  try:
    sqlite3.connect(database).execute("PRAGMA user_version").fetchall()
  except sqlite3.Error as e:
    raise OSError(f"sqlite cannot open {database}: {e}") from None


def experiment_id(mlflow_client, name, uri):
  """The id of experiment `name`, made when missing (a sqlite store keeps its artifacts beside the database, not
  in the current directory)."""
  found = mlflow_client.get_experiment_by_name(name)
  if found is not None:
    return found.experiment_id
  try:
    return mlflow_client.create_experiment(name, artifact_location=artifact_location(uri, name))
  except Exception:  # pylint: disable=broad-except  # a parallel trial made it first
    found = mlflow_client.get_experiment_by_name(name)
    if found is None:
      raise
    return found.experiment_id


def artifact_location(uri, name):
  """Beside a sqlite database: <its folder>/mlartifacts/<name>; the store's own choice for other stores."""
  if not uri.startswith("sqlite:///"):
    return None
  database = uri[len("sqlite:///"):]
  return "file://" + os.path.join(os.path.dirname(os.path.abspath(database)), "mlartifacts", name)


def _exists(mlflow_client, run_id):
  from mlflow.exceptions import MlflowException  # pylint: disable=import-outside-toplevel

  try:
    return mlflow_client.get_run(run_id).info.lifecycle_stage == "active"
  except MlflowException:
    return False
