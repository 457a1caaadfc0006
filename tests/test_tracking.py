"""Tracking: MLflow (a sqlite store, a real `mlflow server`) and W&B offline get what TensorBoard gets, one tracker
run per workdir across a preemption, a sweep as a parent with its trials as children, and a tracker that is down or
slow costs one warning and never the run."""

import glob
import json
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from errors import ConfigError
from launch import sweep_tracking
from loops.persist import tracker_process
from loops.persist import tracking
from tests.conftest import REPO, pythonpath, run_command
from tests.test_reliability import env, start_and_sigterm
from tests.test_sidecar import event_scalars

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

PY = sys.executable
RUN = ["--config=configs/digits_cnn.py", "--config.train.steps_per_loop=10", "--config.eval.every_steps=30",
       "--config.summary.progress_bar=off", "--config.export=False"]


def mlflow_client(uri):
  from mlflow.tracking import MlflowClient
  return MlflowClient(tracking_uri=uri)


def only_run(client):
  """The one MLflow run of the store's experiments (asserting there is exactly one)."""
  runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
  assert len(runs) == 1, [(r.info.run_name, r.info.status) for r in runs]
  return runs[0]


def ended_run(client, timeout_seconds=60):
  """only_run once it is no longer RUNNING: a killed run's tracker process ends it after sending what it was handed
  (it outlives the run by at most its close timeout)."""
  deadline = time.monotonic() + timeout_seconds
  while only_run(client).info.status == "RUNNING" and time.monotonic() < deadline:
    time.sleep(0.2)
  return only_run(client)


def history(client, run_id, key):
  return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def wandb_records(workdir):
  """Every record of the W&B offline runs in workdir/wandb (their .wandb files: LevelDB-style log blocks of
  protobuf Records), oldest run first, as (kind, record)."""
  from wandb.proto import wandb_internal_pb2
  records = []
  for path in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
    for data in _log_records(open(path, "rb").read()):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(data)
      records.append((record.WhichOneof("record_type"), record))
  return records


def _log_records(blob, block=32768, header=7):
  """The payloads of a LevelDB log (W&B's datastore: a 7-byte ':W&B' header, then blocks of chunks, each chunk a
  crc32 (4), a length (2) and a type (1: full, 2: first, 3: middle, 4: last))."""
  assert blob[:4] == b":W&B"
  position, pending = header, b""
  while position + 7 <= len(blob):
    if block - position % block < 7:  # a block's tail too short for a chunk header is padding
      position += block - position % block
      continue
    _, length, kind = struct.unpack("<IHB", blob[position:position + 7])
    payload = blob[position + 7:position + 7 + length]
    position += 7 + length
    if kind == 0 and length == 0:
      break
    pending += payload
    if kind in (1, 4):
      yield pending
      pending = b""


def wandb_history(records, key):
  """{step: value} of key in the W&B history records."""
  values = {}
  for kind, record in records:
    if kind == "history":
      items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
      if key in items:
        values[int(items[tracking_step()])] = items[key]
  return values


def tracking_step():
  from loops.persist import wandb_tracker
  return wandb_tracker.STEP


def test_a_digits_run_is_one_mlflow_run_and_one_wandb_run_across_a_sigterm(tmp_path, monkeypatch):
  """Both trackers at once: the config and plan as params, train and eval scalars at their steps (TensorBoard's
  values), tags, summary.json as an artifact; preempted and rerun, still one run in each."""
  store, workdir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "runs" / "digits"
  command = [PY, "main.py", *RUN, f"--workdir={workdir}", "--config.train.epochs=2000",
             f"--config.tracking.mlflow={store}", "--config.tracking.wandb=loops-test"]
  monkeypatch.setenv("WANDB_MODE", "offline")
  environment = env()
  code, output = start_and_sigterm(command, lambda proc, _: proc.pid, tmp_path, wait_for=r"eval at step 30")
  assert code == 143, output[-3000:]
  client = mlflow_client(store)
  first = only_run(client)
  assert first.info.status == "KILLED"
  resumed = subprocess.run(command[:-3] + ["--config.train.steps=90", *command[-2:]], cwd=REPO, env=environment,
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  run = only_run(client)
  assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
  assert run.info.run_name == "digits" and client.get_experiment(run.info.experiment_id).name == "runs"
  params = run.data.params
  assert params["optimizer.learning_rate"] == "0.05" and params["plan.global_batch_size"] == "64"
  assert params["plan.replicas"] == "1" and run.data.tags["changed.train.steps"] == "90"
  assert {k: run.data.tags[k] for k in ("task", "strategy", "replicas", "workers")} == {
      "task": "classification", "strategy": "one_device", "replicas": "1", "workers": "1"}
  assert len(run.data.tags["git_commit"].split("-")[0]) == 40
  board_eval, board_loss = event_scalars(str(workdir), "eval/accuracy"), event_scalars(str(workdir), "train/loss")
  assert history(client, run.info.run_id, "eval/accuracy") == pytest.approx(board_eval, rel=1e-6)
  assert history(client, run.info.run_id, "train/loss") == pytest.approx(board_loss, rel=1e-6)
  assert 90 in board_eval and len(board_loss) >= 9
  summary = json.loads((workdir / "summary.json").read_text())
  artifacts = client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))
  assert json.load(open(artifacts)) == summary
  assert "best.json" in [a.path for a in client.list_artifacts(run.info.run_id)]

  records = wandb_records(workdir)
  run_ids = {record.run.run_id for kind, record in records if kind == "run"}
  assert run_ids == {json.loads((workdir / "tracking.json").read_text())["wandb"]["run_id"]}
  assert wandb_history(records, "eval/accuracy") == pytest.approx(board_eval, rel=1e-6)
  configs = {item.key: json.loads(item.value_json) for kind, r in records if kind == "config" for item in r.config.update}
  assert configs["optimizer.learning_rate"] == 0.05 and configs["plan.replicas"] == 1
  saved = [f.path for kind, r in records if kind == "files" for f in r.files.files]
  assert "summary.json" in saved


def test_a_sidecar_evaluator_is_a_tracker_run_of_its_own_beside_the_training_and_a_restart_continues_it(
    tiny_digits, tmp_path, monkeypatch):
  """MLflow: the evaluator's run is a child of the training's, with the eval/ curve TensorBoard has in workdir/eval
  and its best.json; W&B: in a group named after the workdir, kept in workdir/eval/wandb. Restarted, the same runs."""
  from loops import run as run_lib
  monkeypatch.setenv("WANDB_MODE", "offline")
  store, workdir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "runs" / "w"
  tiny_digits.tracking.mlflow = store
  run_lib.train_and_evaluate(tiny_digits, str(workdir))  # checkpoints at steps 10 and 20
  tiny_digits.mode, tiny_digits.eval.sidecar_poll_seconds = "evaluate", 0.1
  tiny_digits.tracking.wandb = "loops-test"  # the evaluator's only (a W&B start costs seconds)
  run_lib.train_and_evaluate(tiny_digits, str(workdir))
  client = mlflow_client(store)
  runs = {r.info.run_name: r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])}
  assert sorted(runs) == ["w", "w-evaluator"]
  training, evaluator = runs["w"], runs["w-evaluator"]
  assert evaluator.data.tags["mlflow.parentRunId"] == training.info.run_id
  assert evaluator.data.tags["role"] == "evaluator" and evaluator.info.status == "FINISHED"
  curve = event_scalars(str(workdir / "eval"), "eval/accuracy")
  assert sorted(curve) == [10, 20]
  assert history(client, evaluator.info.run_id, "eval/accuracy") == pytest.approx(curve, rel=1e-6)
  assert "train/loss" not in evaluator.data.metrics and "eval/accuracy" in training.data.metrics
  assert "best.json" in [a.path for a in client.list_artifacts(evaluator.info.run_id)]
  records = wandb_records(workdir / "eval")
  assert wandb_history(records, "eval/accuracy") == pytest.approx(curve, rel=1e-6)
  assert {(record.run.run_group, record.run.display_name) for kind, record in records if kind == "run"} == {
      ("w", "w-evaluator")}

  run_lib.train_and_evaluate(tiny_digits, str(workdir))  # restarted after the end: nothing new, the same runs
  again = {r.info.run_name: r.info.run_id for e in client.search_experiments()
           for r in client.search_runs([e.experiment_id])}
  assert again == {"w": training.info.run_id, "w-evaluator": evaluator.info.run_id}
  recorded = json.loads((workdir / "eval" / tracking.FILE).read_text())
  assert recorded["mlflow"]["run_id"] == evaluator.info.run_id
  assert {record.run.run_id for kind, record in wandb_records(workdir / "eval") if kind == "run"} == {
      recorded["wandb"]["run_id"]}


def test_a_run_killed_with_sigkill_leaves_its_mlflow_run_killed_not_running(tmp_path):
  """The tracker process outlives the run's process by at most its close timeout: stdin's end is the run's end."""
  store = f"sqlite:///{tmp_path}/mlflow.db"
  proc = subprocess.Popen([PY, "main.py", *RUN, f"--workdir={tmp_path / 'w'}", "--config.train.epochs=2000",
                           f"--config.tracking.mlflow={store}"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    for line in proc.stdout:  # the first eval once the MLflow run exists ("eval at step 30" matched step 300 too)
      if re.search(r"eval at step \d+:", line) and (tmp_path / "w" / tracking.FILE).exists():
        break
    proc.kill()  # the run's process only: its tracker process learns it from its stdin
    proc.wait()
    client = mlflow_client(store)
    run = ended_run(client)
    assert run.info.status == "KILLED"
    assert history(client, run.info.run_id, "train/loss")  # what the run had handed over before it died
  finally:
    if proc.poll() is None:
      proc.kill()


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_tracking_server_that_is_down_costs_one_warning_and_the_count_of_what_was_not_sent(tmp_path):
  uri = f"http://127.0.0.1:{free_port()}"
  done = run_command([PY, "main.py", *RUN, f"--workdir={tmp_path / 'w'}", "--config.train.steps=40",
                         f"--config.tracking.mlflow={uri}"], env=env(), timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  warnings = [line.split("] ", 1)[1] for line in done.stderr.splitlines() if "tracker_process.py" in line]
  assert "connectionpool" not in done.stderr and "before flag parsing" not in done.stderr
  assert len(warnings) == 2, warnings
  assert warnings[0].startswith(f"mlflow: {uri}: not reachable (") and "training goes on" in warnings[0]
  assert re.fullmatch(r"mlflow: \d+ values not sent \(not reachable \(.*\)\)", warnings[1]), warnings[1]
  assert json.loads((tmp_path / "w" / "summary.json").read_text())["step"] == 40


@pytest.fixture
def mlflow_server(tmp_path):
  """A real `mlflow server` on a loopback port (its own sqlite store and artifact folder); yields its URI. Without
  MLflow 3's job execution (its huey consumers, ~17 s of CPU starting, run nothing a tracked run sends)."""
  port = free_port()
  server = subprocess.Popen(
      [os.path.join(os.path.dirname(PY), "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
       "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
       "--artifacts-destination", str(tmp_path / "server-artifacts")],
      cwd=tmp_path, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL, start_new_session=True)
  uri = f"http://127.0.0.1:{port}"
  try:
    for _ in range(240):
      try:
        if urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200:
          break
      except OSError:
        time.sleep(0.5)
    else:
      pytest.fail("mlflow server did not answer /health within 120 s")
    yield uri
  finally:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def test_a_sweep_tracked_by_a_real_mlflow_server_is_a_parent_run_with_its_trials_as_children(tmp_path,
                                                                                              mlflow_server):
  sweep_dir = tmp_path / "lr-sweep"
  done = subprocess.run([PY, "-m", "launch.sweep", "--config=configs/digits_cnn.py", f"--sweep_dir={sweep_dir}",
                         "--grid", "optimizer.learning_rate=0.02,0.1", "--", "--config.train.steps=20",
                         "--config.export=False", f"--config.tracking.mlflow={mlflow_server}"],
                        cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  client = mlflow_client(mlflow_server)
  experiment = client.get_experiment_by_name("lr-sweep")
  runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
  assert sorted(runs) == ["learning_rate=0.02", "learning_rate=0.1", "lr-sweep"]
  parent = runs.pop("lr-sweep")
  assert parent.info.status == "FINISHED" and parent.data.params["sweep.grid.optimizer.learning_rate"] == "0.02,0.1"
  for name, child in runs.items():
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
    assert child.data.params["optimizer.learning_rate"] == name.split("=")[1]
    summary = json.loads((sweep_dir / name / "summary.json").read_text())
    assert history(client, child.info.run_id, "eval/accuracy")[20] == pytest.approx(summary["eval/accuracy"])
    assert "summary.json" in [a.path for a in client.list_artifacts(child.info.run_id)]


class FakeTracker:
  """Records its calls; `failures` calls raise ConnectionError first; `gate` (an Event) holds every metrics call,
  `open_gate` the first open."""

  def __init__(self, failures=0, gate=None, open_gate=None):
    self.calls, self.failures, self.gate, self.open_gate = [], failures, gate, open_gate

  def open(self, run_id):
    if self.open_gate is not None:
      self.open_gate.wait()
    self._maybe_fail()
    return run_id or "new-run"

  def tags(self, values):
    self.calls.append(("tags", values))

  def _maybe_fail(self):
    if self.failures:
      self.failures -= 1
      raise ConnectionError("connection refused")

  def metrics(self, points):
    if self.gate is not None:
      self.gate.wait()
    self._maybe_fail()
    self.calls.append(("metrics", [(step, values) for step, values, _ in points]))

  def finish(self, status):
    self.calls.append(("finish", status))


def test_a_tracker_that_fails_is_one_warning_its_values_are_counted_and_it_is_tried_again(caplog, monkeypatch):
  caplog.set_level(logging.INFO)
  monkeypatch.setattr(tracker_process, "RETRY_SECONDS", 3600.0)
  fake, reported = FakeTracker(failures=1), []
  senders = [tracker_process.Sender("fake", fake, None, reported.append, "setting")]
  for step in (10, 20, 30):
    senders[0].put("metrics", (step, {"train/loss": 1.0, "train/accuracy": 0.5}, 0), 2)
  tracker_process.close_all(senders, "FINISHED", 5)
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fake:")]
  assert lines == ["fake: setting: not reachable (ConnectionError); training goes on (what it cannot send is "
                   "counted, and it is tried again every 3600 s)",
                   "fake: 6 values not sent (not reachable (ConnectionError))"]
  assert fake.calls == [] and reported == []  # down for the rest of the hour: nothing sent, the finish neither

  caplog.clear()
  monkeypatch.setattr(tracker_process, "RETRY_SECONDS", 0.0)
  monkeypatch.setattr(tracker_process, "BATCH_SECONDS", 0.0)
  opened = threading.Event()
  fake = FakeTracker(failures=1, open_gate=opened)
  senders = [tracker_process.Sender("fake", fake, None, reported.append, "setting")]
  senders[0].put("metrics", (10, {"train/loss": 10.0}, 0), 1)
  time.sleep(0.2)  # the sender takes it and waits in open: the next calls queue up meanwhile
  senders[0].put("tags", ({"a": "b"},), 1)
  for step in (20, 30):
    senders[0].put("metrics", (step, {"train/loss": float(step)}, 0), 1)
  opened.set()
  tracker_process.close_all(senders, "FINISHED", 5)
  assert fake.calls == [("tags", {"a": "b"}), ("metrics", [(20, {"train/loss": 20.0}), (30, {"train/loss": 30.0})]),
                        ("finish", "FINISHED")]
  assert reported == ["new-run"]
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fake:")]
  assert lines[1:] == ["fake: reachable again (1 values not sent while it was down)",
                       "fake: 1 values not sent while it was down (not reachable (ConnectionError)); it took every "
                       "value since it came back"]


def test_a_run_id_the_killed_run_cannot_take_is_recorded_in_its_workdir_and_the_values_still_go(tmp_path, caplog):
  """kill -9 before the tracker opened its run (a short run on a loaded machine): reporting the id to the run hit a
  broken pipe, which counted as the tracker failing: nothing was sent and the run stayed RUNNING."""
  def gone(kind, run_id):
    raise BrokenPipeError(32, "Broken pipe")

  path = tmp_path / "tracking.json"
  path.write_text(json.dumps({"wandb": {"run_id": "w1", "setting": "project"}}))
  fake, added = FakeTracker(), {"kind": "fake", "setting": "setting", "record": str(path), "run_id": None}
  senders = [tracker_process.Sender("fake", fake, None, lambda run_id: tracker_process.remember(gone, added, run_id))]
  senders[0].put("metrics", (10, {"train/loss": 1.0}, 0), 1)
  tracker_process.close_all(senders, "KILLED", 5)
  assert fake.calls == [("metrics", [(10, {"train/loss": 1.0})]), ("finish", "KILLED")]
  assert json.loads(path.read_text()) == {"wandb": {"run_id": "w1", "setting": "project"},
                                          "fake": {"run_id": "new-run", "setting": "setting"}}
  tracker_process.remember(gone, added, "late")  # a rerun recorded its own run meanwhile: it stays
  assert json.loads(path.read_text())["fake"]["run_id"] == "new-run"
  tracker_process.remember(gone, {**added, "record": "gs://bucket/w/tracking.json"}, "r2")
  assert [r.getMessage() for r in caplog.records] == [
      "fake: run r2 is not recorded in gs://bucket/w/tracking.json (the run's process is gone, and only it writes "
      "there): a resumed run starts another"]


def test_a_run_gone_without_its_close_line_ends_killed_within_its_own_close_timeout(monkeypatch, caplog):
  """stdin's end (kill -9) waited a fixed 30 s, while its warning named tracking.close_timeout_seconds."""
  gate = threading.Event()
  monkeypatch.setattr(tracker_process, "make", lambda kind, options: FakeTracker(gate=gate))
  added = {"op": "add", "kind": "slow", "setting": "s", "options": {}, "run_id": "r1", "record": "unused",
           "close_timeout": 2.0}
  lines = [json.dumps(added), json.dumps({"op": "metrics", "args": [10, {"train/loss": 1.0}, 0], "count": 1})]
  tracker_process.serve(lines, report=None)
  gate.set()
  assert [r.getMessage() for r in caplog.records] == [
      "slow: still sending after 2 s (tracking.close_timeout_seconds): 1 values not sent"]


def test_a_slow_tracker_never_holds_up_the_caller_and_the_end_waits_only_so_long(caplog):
  caplog.set_level(logging.INFO)
  gate = threading.Event()
  fake = FakeTracker(gate=gate)
  senders = [tracker_process.Sender("slow", fake, "run-1", None, "setting")]
  for step in (10, 20, 30):  # would block here if a call waited for the tracker
    senders[0].put("metrics", (step, {"train/loss": 1.0}, 0), 1)
  tracker_process.close_all(senders, "FINISHED", 0.5)
  gate.set()
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slow:")]
  assert lines == ["slow: still sending after 0 s (tracking.close_timeout_seconds): 3 values not sent"]


@pytest.mark.parametrize("key,value,message", [
    ("mlflow", "mlruns", "tracking.mlflow 'mlruns' is not an MLflow tracking URI; valid: "
                         "sqlite:///abs/mlflow.db, http(s)://host:port, databricks, or '' (off)"),
    ("mlflow", "file:/abs/dir", "tracking.mlflow 'file:/abs/dir': MLflow refuses to write a file store (its "
                                "filesystem backend is in maintenance mode), so every value would be lost; use "
                                "sqlite:///abs/mlflow.db (`mlflow migrate-filestore` moves an existing store), or "
                                "set MLFLOW_ALLOW_FILE_STORE=true to write the file store anyway"),
    ("wandb", "team/project", "tracking.wandb must be a W&B project name (no '/', at most 128 characters), got "
                              "'team/project'"),
    ("close_timeout_seconds", -1.0, "tracking.close_timeout_seconds must be >= 0, got -1.0"),
])
def test_tracker_settings_are_refused_in_one_line(key, value, message):
  from configs import base
  config = base.get_config()
  config.tracking[key] = value
  with pytest.raises(ConfigError) as raised:
    tracking.check_settings(config.tracking)
  assert str(raised.value) == message


def test_a_file_store_is_taken_when_mlflow_is_told_to_write_it(monkeypatch, tmp_path):
  """MLflow's own opt-in: with it, the file store is written (read back through MLflow)."""
  monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
  from configs import base
  config = base.get_config()
  config.tracking.mlflow = f"file:{tmp_path}/mlruns"
  tracking.check_settings(config.tracking)
  import mlflow
  mlflow.set_tracking_uri(config.tracking.mlflow)
  with mlflow.start_run() as run:
    mlflow.log_metric("train/loss", 0.5, step=3)
  assert [(m.step, m.value) for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "train/loss")] == [
      (3, 0.5)]


def test_a_sweep_reads_its_trackers_from_the_dry_run_report():
  report = "  callbacks: []\n  tracking: mlflow=sqlite:////x/m.db (experiment lr=0.1) wandb=proj\n  workdir: /w\n"
  assert sweep_tracking.from_dry_run(report) == {"mlflow": "sqlite:////x/m.db", "wandb": "proj"}
  assert sweep_tracking.from_dry_run("  tracking: off\n") == {}


def test_the_tracker_process_imports_no_tensorflow_and_a_run_imports_no_tracker():
  code = "import sys; from loops.persist import tracker_process; print('tensorflow' in sys.modules)"
  done = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
  assert done.stdout.strip() == "False", done.stderr[-2000:]
  code = ("import sys; from loops import run; from launch import sweep; "
          "print([m for m in ('mlflow', 'wandb') if m in sys.modules])")
  done = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
  assert done.stdout.strip() == "[]", done.stderr[-2000:]


STARTING_TOGETHER = """
import os, sys, time
import mlflow.tracking  # imported before the moment both start
from loops.persist.mlflow_tracker import MlflowTracker
go, uri, name = sys.argv[1:]
while not os.path.exists(go):
  time.sleep(0.005)
tracker = MlflowTracker(uri, "side-by-side", name)
tracker.open(None)
tracker.metrics([(1, {"train/loss": float(len(name))}, int(time.time() * 1000))])
tracker.finish("FINISHED")
"""


def test_two_runs_starting_together_on_one_new_sqlite_store_are_both_recorded(tmp_path):
  """Two real processes make the same new database at once (a sweep and a run side by side): both runs are
  recorded, each with its values."""
  uri, go = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "go"
  processes = [subprocess.Popen([PY, "-c", STARTING_TOGETHER, str(go), uri, name], cwd=REPO, env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for name in ("a", "bb")]
  time.sleep(3)  # both have imported MLflow and wait for the same moment
  go.touch()
  outputs = [process.communicate(timeout=120)[0] for process in processes]
  assert [process.returncode for process in processes] == [0, 0], outputs
  client = mlflow_client(uri)
  runs = client.search_runs([client.get_experiment_by_name("side-by-side").experiment_id])
  assert sorted((run.info.run_name, run.data.metrics["train/loss"]) for run in runs) == [("a", 1.0), ("bb", 2.0)]


def test_a_sqlite_store_that_cannot_be_opened_is_one_line_at_once(tmp_path, caplog, monkeypatch):
  """A directory where the database should be: MLflow retried for ~50 s, logging seven SQLAlchemy blocks."""
  from loops.persist import mlflow_tracker
  from loops.persist.mlflow_tracker import MlflowTracker
  monkeypatch.setattr(mlflow_tracker, "client", lambda uri: pytest.fail("MLflow's client (and its retries) reached"))
  (tmp_path / "store").mkdir()
  with pytest.raises(OSError) as raised:
    MlflowTracker(f"sqlite:///{tmp_path}/store", "e", "r").open(None)
  assert str(raised.value) == f"sqlite cannot open {tmp_path}/store: unable to open database file"
  assert not [r for r in caplog.records if "SQLAlchemy" in r.getMessage()]


def test_a_run_killed_after_its_last_checkpoint_and_resumed_logs_each_step_once(tmp_path):
  """kill -9 at step 70 (checkpoint at 50; MLflow has steps up to 70): the resumed attempt trains 51-70 again and
  sent them a second time, with other values. Now each step holds one point, and a tag says which are the killed
  attempt's."""
  store, workdir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "runs" / "digits"
  command = [PY, "main.py", *RUN, f"--workdir={workdir}", "--config.train.steps=90",
             "--config.checkpoint.every_steps=50", f"--config.tracking.mlflow={store}"]
  killing = {**env(), "PYTHONPATH": pythonpath(os.path.join(REPO, "tests", "fixtures", "plugins")),
             "KILL_AT_STEP": "70"}
  killed = subprocess.run(command + ["--config.callbacks=('my_callbacks:killed_at_step',)"], cwd=REPO, env=killing,
                          capture_output=True, text=True, timeout=300)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  client = mlflow_client(store)
  run_id = ended_run(client).info.run_id  # its tracker process may still be sending when the run is gone
  assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [10, 20, 30, 40, 50, 60, 70], (
      killed.stderr[-3000:])
  resumed = subprocess.run(command, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  run = only_run(client)
  for key, steps in (("train/loss", [10, 20, 30, 40, 50, 60, 70, 80, 90]), ("eval/accuracy", [30, 60, 90])):
    assert sorted(m.step for m in client.get_metric_history(run_id, key)) == steps, key
  assert run.info.status == "FINISHED" and run.data.tags["replayed_steps"].startswith(
      "60-70: logged by an attempt that ended before a checkpoint held them")
