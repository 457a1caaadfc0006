"""launch/k8s: each TFJob manifest, read as the training-operator reads it, gives every replica a TF_CONFIG that
loops/distribute/cluster.py accepts with the right role, and all replicas agree on the command and the shared workdir."""

import json
import os

import pytest
import yaml

from loops.distribute import cluster
from loops.distribute import parameter_server
from tests.conftest import REPO

K8S = os.path.join(REPO, "launch", "k8s")
MANIFESTS = {"mwms.yaml": "multi_worker_mirrored", "parameter_server.yaml": "parameter_server"}
REPLICA_TYPES = ("Chief", "Master", "Worker", "PS", "Evaluator")  # kubeflow.org/v1 TFJobReplicaType*


def load(name):
  with open(os.path.join(K8S, name)) as f:
    return yaml.safe_load(f)


def container(replica):
  """The container the operator reads (TFJobDefaultContainerName)."""
  [found] = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
  return found


def port(replica):
  """GetPortFromTFJob: the container port named tfjob-port, else TFJobDefaultPort."""
  ports = [p["containerPort"] for p in container(replica).get("ports", []) if p.get("name") == "tfjob-port"]
  return ports[0] if ports else 2222


def tf_configs(job, lists_evaluator):
  """{(type, index): TF_CONFIG} as genTFConfigJSONStr writes it: lowercased replica types, hosts
  `<job>-<type>-<i>.<namespace>.svc:<port>`, "environment": "cloud"; kubeflow.org/v1 operators list the
  evaluator in "cluster", v1alpha2 ones left it out."""
  name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
  replicas = job["spec"]["tfReplicaSpecs"]
  spec = {}
  for replica_type, replica in replicas.items():
    rt = replica_type.lower()
    if rt == "evaluator" and not lists_evaluator:
      continue
    spec[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{port(replica)}" for i in range(replica.get("replicas", 1))]
  cluster_json = dict(sorted(spec.items()))  # Go's encoding/json sorts map keys
  return {(rt.lower(), i): json.dumps({"cluster": cluster_json, "task": {"type": rt.lower(), "index": i},
                                       "environment": "cloud"}, separators=(",", ":"))
          for rt, replica in replicas.items() for i in range(replica.get("replicas", 1))}


def flags(replica):
  """--name=value arguments of the container's command (and args)."""
  c = container(replica)
  argv = c.get("command", []) + c.get("args", [])
  return argv, dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


@pytest.mark.parametrize("lists_evaluator", [True, False], ids=["operator_v1", "operator_v1alpha2"])
@pytest.mark.parametrize("manifest", sorted(MANIFESTS))
def test_every_replica_gets_a_tf_config_we_accept(manifest, lists_evaluator):
  job = load(manifest)
  replicas = job["spec"]["tfReplicaSpecs"]
  assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob") and set(replicas) <= set(REPLICA_TYPES)
  has_chief = "Chief" in replicas or "Master" in replicas
  configs = tf_configs(job, lists_evaluator)
  assert len(configs) == sum(r.get("replicas", 1) for r in replicas.values())
  chiefs = []
  for (rt, index), raw in configs.items():
    task = cluster.from_environment({"TF_CONFIG": raw}, source="tf_config")
    parsed_type = "chief" if rt == "master" else rt
    assert (task.type, task.index, task.is_evaluator) == (parsed_type, index, rt == "evaluator")
    assert "evaluator" not in task.cluster and task.is_distributed is (rt != "evaluator")
    if task.is_chief:
      chiefs.append((rt, index))
  assert chiefs == [("chief", 0)] if has_chief else chiefs == [("worker", 0)]


def test_mwms_is_worker_only():
  """MultiWorkerMirroredStrategy: identical workers, worker 0 is the chief; no ps, no evaluator to join."""
  replicas = load("mwms.yaml")["spec"]["tfReplicaSpecs"]
  assert list(replicas) == ["Worker"] and replicas["Worker"]["replicas"] >= 2


def test_parameter_server_cluster_passes_the_strategy_check():
  job = load("parameter_server.yaml")
  replicas = job["spec"]["tfReplicaSpecs"]
  assert replicas["Chief"]["replicas"] == 1 and replicas["Evaluator"]["replicas"] == 1
  raw = tf_configs(job, lists_evaluator=True)[("chief", 0)]
  task = cluster.from_environment({"TF_CONFIG": raw}, source="tf_config")
  parameter_server.check_cluster(task)  # one chief, workers and ps: raises ConfigError otherwise
  assert set(task.cluster) == {"chief", "worker", "ps"}


@pytest.mark.parametrize("manifest", sorted(MANIFESTS))
def test_replicas_share_command_workdir_and_restart_on_exit_code(manifest):
  """restartPolicy ExitCode on every replica (>= 128 restarts, e.g. 143 after a preemption save; 1..127 do
  not), and one command: same config, strategy and --workdir on the ReadWriteMany claim (or gs://)."""
  replicas = load(manifest)["spec"]["tfReplicaSpecs"]
  pvc = load("workdir-pvc.yaml")
  assert "ReadWriteMany" in pvc["spec"]["accessModes"]
  commands = set()
  for replica_type, replica in replicas.items():
    assert replica["restartPolicy"] == "ExitCode", replica_type
    argv, named = flags(replica)
    assert argv[:2] == ["python", "main.py"] and os.path.isfile(os.path.join(REPO, named["config"].split(":")[0]))
    assert named["config.strategy"] == MANIFESTS[manifest]
    commands.add((tuple(argv), container(replica)["image"], container(replica).get("workingDir")))
    workdir = named["workdir"]
    if not workdir.startswith("gs://"):
      pod = replica["template"]["spec"]
      claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                if "persistentVolumeClaim" in v}
      mounts = [m for m in container(replica)["volumeMounts"] if workdir.startswith(m["mountPath"].rstrip("/") + "/")]
      assert mounts and claims[mounts[0]["name"]] == pvc["metadata"]["name"], replica_type
  assert len(commands) == 1, commands


def test_the_data_service_pool_runs_our_dispatcher_and_workers_pointed_at_its_service():
  from data import service
  with open(os.path.join(K8S, "data-service.yaml")) as f:
    documents = {d["metadata"]["name"]: d for d in yaml.safe_load_all(f)}
  port = documents["data-service"]["spec"]["ports"][0]["port"]
  commands = {name: documents[name]["spec"]["template"]["spec"]["containers"][0]["command"]
              for name in ("data-dispatcher", "data-workers")}
  for name, command in commands.items():
    assert command[:3] == ["python", "-m", "data.service"], name
  dispatcher = service.command_line().parse_args(commands["data-dispatcher"][3:])
  worker = service.command_line().parse_args(commands["data-workers"][3:])
  assert dispatcher.role == "dispatcher" and dispatcher.port == port and dispatcher.work_dir.startswith("/workdir/")
  assert worker.role == "worker" and worker.dispatcher == f"data-service:{port}"
  assert documents["data-service"]["spec"]["selector"] == documents["data-dispatcher"]["spec"]["selector"]["matchLabels"]
