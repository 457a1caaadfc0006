"""A sweep in the trackers its trials use (tracking.* in the config or after --): an MLflow parent run whose
children are the trials, and a W&B group named after the sweep directory.

  open_parent(sweep_dir, tracking, sweep)   makes or continues the parent (its id in DIR/tracking.json)
  trial_flags(sweep_dir)                    the --config.tracking.* flags of every trial (not in its fingerprint)
  close_parent(sweep_dir, code)             FINISHED when every trial is complete, else KILLED or FAILED
"""

import os
import re
import time

from launch import sweep_report

FILE = "tracking.json"
STATUS = {0: "FINISHED", sweep_report.PREEMPTED: "KILLED"}


def from_dry_run(stdout):
  """{'mlflow': URI, 'experiment': NAME, 'wandb': PROJECT} (what is on) from main.py --dry_run's tracking line."""
  found = re.search(r"^\s*tracking: (.*)$", stdout, re.M)
  if not found or found.group(1).strip() == "off":
    return {}
  words = dict(word.split("=", 1) for word in found.group(1).split() if "=" in word)
  return {key: value for key, value in words.items() if key in ("mlflow", "wandb", "experiment")}


def open_parent(sweep_dir, tracking, sweep):
  """Records the sweep's group and, with MLflow, makes (or continues) its parent run in the trials' experiment."""
  if not tracking:
    return
  record = _read(sweep_dir)
  record["group"] = os.path.basename(sweep_dir.rstrip("/"))
  if tracking.get("mlflow"):
    try:
      record["mlflow"] = _mlflow_parent(tracking, record.get("mlflow") or {}, sweep, record["group"])
    except Exception as e:  # pylint: disable=broad-except  # a tracker never costs a run, nor a sweep
      print(f"[sweep] warning: mlflow: no parent run ({type(e).__name__}: {str(e).splitlines()[0][:200]}); the "
            "trials are tracked on their own")
  _write(sweep_dir, record)


def _mlflow_parent(tracking, previous, sweep, name):
  """{'setting', 'run_id'} of the sweep's parent run (continued when the store still holds it), its params the
  sweep's space and search. The experiment is made as the trials' runs make it (loops/persist/mlflow_tracker.py)."""
  from mlflow.entities import Param, RunTag  # pylint: disable=import-outside-toplevel

  uri = tracking["mlflow"]
  client = mlflow_client(uri)
  run_id = previous.get("run_id") if previous.get("setting") == uri else None
  if run_id and client.get_run(run_id).info.lifecycle_stage == "active":
    client.update_run(run_id, status="RUNNING")
  else:
    run_id = client.create_run(_experiment_id(client, tracking.get("experiment") or name, uri), run_name=name,
                               tags={"mlflow.runName": name, "sweep": "parent"}).info.run_id
  params = {"sweep.search": sweep["search"], "sweep.prune": sweep["prune"], "sweep.trials": sweep["count"],
            "sweep.config": sweep["config"], "sweep.extra_args": " ".join(sweep["extra_args"]),
            **{f"sweep.grid.{spec.split('=', 1)[0]}": spec.split("=", 1)[1] for spec in sweep["specs"]}}
  known = client.get_run(run_id).data.params
  client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items() if k not in known],
                   tags=[RunTag(f"changed.{k}", str(v)) for k, v in params.items() if k in known and known[k] != str(v)])
  return {"setting": uri, "run_id": run_id}


def mlflow_client(uri):
  import logging  # pylint: disable=import-outside-toplevel
  from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel

  for noisy in ("alembic", "mlflow"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name, uri):
  """As the trials' runs find or make it: a sqlite store keeps artifacts beside its database."""
  found = client.get_experiment_by_name(name)
  if found is not None:
    return found.experiment_id
  location = None
  if uri.startswith("sqlite:///"):
    folder = os.path.dirname(os.path.abspath(uri[len("sqlite:///"):]))
    location = "file://" + os.path.join(folder, "mlartifacts", name)
  return client.create_experiment(name, artifact_location=location)


def trial_flags(sweep_dir):
  """--config.tracking.parent_run / group for a trial of the sweep in sweep_dir ([] without trackers)."""
  record = _read(sweep_dir)
  flags = [f"--config.tracking.group={record['group']}"] if record.get("group") else []
  if (record.get("mlflow") or {}).get("run_id"):
    flags.append(f"--config.tracking.parent_run={record['mlflow']['run_id']}")
  return flags


def close_parent(sweep_dir, code):
  """Ends the MLflow parent run with the sweep's outcome (a rerun continues it)."""
  parent = _read(sweep_dir).get("mlflow")
  if not parent:
    return
  try:
    mlflow_client(parent["setting"]).set_terminated(parent["run_id"], status=STATUS.get(code, "FAILED"),
                                                            end_time=int(time.time() * 1000))
  except Exception as e:  # pylint: disable=broad-except  # the sweep's own result stands
    print(f"[sweep] warning: mlflow: the parent run could not be ended: {type(e).__name__}: {e}")



def _read(sweep_dir):
  return sweep_report.read_json(os.path.join(sweep_dir, FILE)) or {}


def _write(sweep_dir, record):
  sweep_report.write_json(os.path.join(sweep_dir, FILE), record)
