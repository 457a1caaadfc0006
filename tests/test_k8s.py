"""launch/k8s: the Indexed Job and the JobSet, read as Kubernetes and the JobSet controller make their pods (names,
labels, env, podFailurePolicy), give every pod the same MultiWorkerMirrored cluster through cluster.source=k8s;
the derivation from a pod's environment on its own; each TFJob manifest, read as the training-operator reads it,
gives every replica a TF_CONFIG that loops/distribute/cluster.py accepts with the right role, and all replicas
agree on the command and the shared workdir."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from errors import ConfigError
from loops import rules
from loops.distribute import cluster
from loops.distribute import parameter_server
from tests.conftest import REPO, load_config

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


# The Indexed Job and the JobSet: no operator, the cluster from what each pod sees (cluster.source=k8s).

NAMESPACE = "team"
PREEMPTED = load_config("digits_cnn").preemption.exit_code  # 143 unless a config changes it


def load_all(name):
  with open(os.path.join(K8S, name)) as f:
    return {d["kind"]: d for d in yaml.safe_load_all(f)}


def the_container(pod_spec):
  [found] = [c for c in pod_spec["containers"] if c["name"] == "tensorflow"]
  return found


def pod_env(pod_spec, labels, hostname, index):
  """The container's environment in a pod: its env (values, downward API fieldRefs to the namespace and labels),
  what Kubernetes adds to an Indexed Job's pod (JOB_COMPLETION_INDEX) and the container runtime's HOSTNAME."""
  env = {"HOSTNAME": hostname, "JOB_COMPLETION_INDEX": str(index)}
  for variable in the_container(pod_spec).get("env", []):
    if "value" in variable:
      env[variable["name"]] = variable["value"]
      continue
    path = variable["valueFrom"]["fieldRef"]["fieldPath"]
    label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    assert label or path == "metadata.namespace", path
    env[variable["name"]] = labels[label.group(1)] if label else NAMESPACE
  return env


def flag(pod_spec, name, default=None):
  argv = the_container(pod_spec)["command"]
  return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), default)


def derive(pod_spec, env):
  source = flag(pod_spec, "config.cluster.source", "auto")
  port = int(flag(pod_spec, "config.cluster.k8s_port", load_config("digits_cnn").cluster.k8s_port))
  return cluster.from_environment(env, source=source, k8s_port=port), port


def indexed_job_pods(job):
  """(labels, env) of every pod: hostname <job>-<index>, labels job-name and batch.kubernetes.io/job-name."""
  name, template = job["metadata"]["name"], job["spec"]["template"]
  for index in range(job["spec"]["completions"]):
    labels = {**template.get("metadata", {}).get("labels", {}), "job-name": name,
              "batch.kubernetes.io/job-name": name, "batch.kubernetes.io/job-completion-index": str(index)}
    yield labels, pod_env(template["spec"], labels, f"{name}-{index}", index)


def jobset_pods(jobset, replicated_job):
  """(hostname, env) of every pod as the JobSet controller labels them: Job <jobset>-<rjob>-<j>, pod hostnames
  <job>-<p>."""
  name, job = jobset["metadata"]["name"], replicated_job["template"]["spec"]
  replicas = replicated_job.get("replicas", 1)
  for j in range(replicas):
    for p in range(job["completions"]):
      labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/job-index": str(j),
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job["name"],
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas)}
      hostname = f"{name}-{replicated_job['name']}-{j}-{p}"
      yield hostname, pod_env(job["template"]["spec"], labels, hostname, p)


def pod_failure_action(policy, exit_code=None, conditions=()):
  """Kubernetes' podFailurePolicy: the first rule whose exit codes (of the named container) or pod conditions
  match the failed pod; no match = Count."""
  for rule in policy["rules"]:
    codes, patterns = rule.get("onExitCodes"), rule.get("onPodConditions", [])
    if codes and exit_code is not None and codes.get("containerName", "tensorflow") == "tensorflow":
      if (exit_code in codes["values"]) == (codes["operator"] == "In"):
        return rule["action"]
    if any(c["type"] in conditions and c.get("status", "True") == "True" for c in patterns):
      return rule["action"]
  return "Count"


def jobset_action(failure_policy, reason):
  """JobSet's failurePolicy: the first rule listing the Job's failure reason (or none); no match = RestartJobSet."""
  for rule in failure_policy.get("rules", []):
    if reason in rule.get("onJobFailureReasons", [reason]):
      return rule["action"]
  return "RestartJobSet"


def check_command_and_workdir(pod_spec):
  """One command for every pod (one template), MWMS with cluster.source=k8s, the workdir on the shared claim."""
  argv = the_container(pod_spec)["command"]
  assert argv[:2] == ["python", "main.py"] and "--config.cluster.source=k8s" in argv
  assert os.path.isfile(os.path.join(REPO, flag(pod_spec, "config").split(":")[0]))
  assert flag(pod_spec, "config.strategy") == "multi_worker_mirrored"
  claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec["volumes"]}
  [mount] = [m for m in the_container(pod_spec)["volumeMounts"] if flag(pod_spec, "workdir").startswith(m["mountPath"])]
  assert claims[mount["name"]] == load("workdir-pvc.yaml")["metadata"]["name"]
  assert pod_spec["restartPolicy"] == "Never" and pod_spec["terminationGracePeriodSeconds"] >= 60


def test_the_indexed_job_and_its_headless_service_name_every_pod():
  docs = load_all("indexed-job.yaml")
  service, job = docs["Service"], docs["Job"]
  assert (service["apiVersion"], job["apiVersion"]) == ("v1", "batch/v1") and set(docs) == {"Service", "Job"}
  spec, pod = job["spec"], job["spec"]["template"]["spec"]
  workers = spec["completions"]
  assert spec["completionMode"] == "Indexed" and spec["parallelism"] == workers >= 2
  assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
  check_command_and_workdir(pod)
  tasks = []
  for labels, env in indexed_job_pods(job):
    assert service["spec"]["selector"].items() <= labels.items()  # the Service publishes every pod
    assert int(env["K8S_JOB_COMPLETIONS"]) == workers and env["K8S_SERVICE"] == pod["subdomain"]
    task, port = derive(pod, env)
    assert port in [p["containerPort"] for p in the_container(pod)["ports"]]
    tasks.append(task)
  hosts = [f"{job['metadata']['name']}-{i}.{pod['subdomain']}.{NAMESPACE}.svc:{port}" for i in range(workers)]
  assert [(t.type, t.index, t.is_chief) for t in tasks] == [("worker", i, i == 0) for i in range(workers)]
  assert all(t.cluster == {"worker": hosts} and t.num_workers == workers for t in tasks)


def test_the_jobset_names_every_pod_of_its_replicated_job():
  jobset = load_all("jobset.yaml")["JobSet"]
  assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
  assert jobset["spec"].get("network", {}).get("enableDNSHostnames", True)  # JobSet's headless Service
  [replicated] = jobset["spec"]["replicatedJobs"]
  job, pod = replicated["template"]["spec"], replicated["template"]["spec"]["template"]["spec"]
  workers = replicated.get("replicas", 1) * job["completions"]
  assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"] and workers >= 2
  check_command_and_workdir(pod)
  subdomain = jobset["spec"].get("network", {}).get("subdomain") or jobset["metadata"]["name"]
  tasks, hostnames = [], []
  for hostname, env in jobset_pods(jobset, replicated):
    assert int(env["K8S_JOB_COMPLETIONS"]) == job["completions"]
    task, port = derive(pod, env)
    tasks.append(task)
    hostnames.append(f"{hostname}.{subdomain}.{NAMESPACE}.svc:{port}")
  assert [(t.type, t.index, t.is_chief) for t in tasks] == [("worker", i, i == 0) for i in range(workers)]
  assert all(t.cluster == {"worker": hostnames} for t in tasks)


def test_the_indexed_job_recreates_preempted_pods_uncounted_and_fails_on_a_user_error():
  job = load_all("indexed-job.yaml")["Job"]["spec"]
  policy = job["podFailurePolicy"]
  assert PREEMPTED == 143 and 1 <= job["backoffLimit"] <= 6 and "backoffLimitPerIndex" not in job
  assert pod_failure_action(policy, exit_code=1) == "FailJob"  # a user error: rerunning cannot help
  assert pod_failure_action(policy, exit_code=PREEMPTED) == "Ignore"  # saved (or lost a peer): recreated, uncounted
  assert pod_failure_action(policy, exit_code=137, conditions={"DisruptionTarget"}) == "Ignore"  # evicted
  assert pod_failure_action(policy, exit_code=137) == "Count"  # killed, out of memory: counted against backoffLimit


def test_the_jobset_restarts_every_job_together_but_not_after_a_user_error():
  spec = load_all("jobset.yaml")["JobSet"]["spec"]
  failure = spec["failurePolicy"]
  [replicated] = spec["replicatedJobs"]
  job = replicated["template"]["spec"]
  assert failure["restartStrategy"] == "BlockingRecreate" and failure["maxRestarts"] >= 1
  assert job["backoffLimit"] == 0  # one failed pod fails its Job, and the JobSet recreates every Job

  def outcome(exit_code, conditions=()):
    action = pod_failure_action(job["podFailurePolicy"], exit_code, conditions)
    assert action in ("FailJob", "Count")  # no pod comes back alone into a collective group
    return jobset_action(failure, "PodFailurePolicy" if action == "FailJob" else "BackoffLimitExceeded")
  assert outcome(1) == "FailJobSet"
  assert outcome(PREEMPTED) == outcome(137) == outcome(137, {"DisruptionTarget"}) == "RestartJobSet"


# What a pod's environment gives (loops/distribute/k8s.py), without the manifests.

def indexed_pod(index, completions=3, job="train", **extra):
  return {"JOB_COMPLETION_INDEX": str(index), "K8S_JOB_COMPLETIONS": str(completions), "HOSTNAME": f"{job}-{index}",
          "K8S_SERVICE": "train-svc", **extra}


def jobset_pod(job_index, pod_index, replicas=2, completions=2, **extra):
  return {"JOB_COMPLETION_INDEX": str(pod_index), "K8S_JOB_COMPLETIONS": str(completions), "JOBSET_NAME": "js",
          "REPLICATED_JOB_NAME": "workers", "JOB_INDEX": str(job_index), "REPLICATED_JOB_REPLICAS": str(replicas),
          "HOSTNAME": f"js-workers-{job_index}-{pod_index}", **extra}


@pytest.mark.parametrize("index", range(3))
def test_an_indexed_job_pod_is_worker_index_and_pod_0_the_chief(index):
  task = cluster.from_environment(indexed_pod(index))
  assert (task.type, task.index, task.is_chief, task.num_workers) == ("worker", index, index == 0, 3)
  assert task.cluster == {"worker": ["train-0.train-svc:2222", "train-1.train-svc:2222", "train-2.train-svc:2222"]}
  assert cluster.from_environment(indexed_pod(index), k8s_port=3333).cluster["worker"][0] == "train-0.train-svc:3333"


@pytest.mark.parametrize("extra, host", [
    ({}, "train-1.train-svc"),
    ({"K8S_NAMESPACE": "team"}, "train-1.train-svc.team.svc"),
    ({"K8S_NAMESPACE": "team", "K8S_CLUSTER_DOMAIN": "cluster.local"}, "train-1.train-svc.team.svc.cluster.local"),
])
def test_short_names_or_qualified_by_the_namespace(extra, host):
  assert cluster.from_environment(indexed_pod(0, **extra)).cluster["worker"][1] == f"{host}:2222"


@pytest.mark.parametrize("job_index, pod_index, rank", [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)])
def test_a_jobset_pod_counts_job_by_job(job_index, pod_index, rank):
  task = cluster.from_environment(jobset_pod(job_index, pod_index))
  assert (task.index, task.is_chief, task.num_workers) == (rank, rank == 0, 4)
  assert task.cluster["worker"] == [f"js-workers-{j}-{p}.js:2222" for j in range(2) for p in range(2)]
  named = cluster.from_environment(jobset_pod(job_index, pod_index, K8S_SERVICE="net", K8S_NAMESPACE="team"))
  assert named.cluster["worker"][3] == "js-workers-1-1.net.team.svc:2222"  # spec.network.subdomain: net


def test_auto_takes_tf_config_mpi_and_srun_first_and_k8s_only_with_the_completions():
  tf_config = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})}
  assert cluster.from_environment({**indexed_pod(0), **tf_config}).cluster == {"worker": ["a:1", "b:2"]}
  assert cluster.from_environment({**indexed_pod(2), **tf_config}, source="k8s").index == 2  # asked for: k8s
  srun = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]",
          "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "7"}
  assert cluster.from_environment({**indexed_pod(0), **srun}).cluster["worker"][0].startswith("n1:")
  without_completions = {k: v for k, v in indexed_pod(1).items() if k != "K8S_JOB_COMPLETIONS"}
  assert cluster.from_environment(without_completions) == cluster.ClusterRole()  # an Indexed Job of local runs
  assert cluster.from_environment(indexed_pod(1), source="local") == cluster.ClusterRole()


def test_a_single_pod_job_trains_locally_and_multi_worker_mirrored_names_what_it_found():
  from loops.distribute import rules as distribute_rules
  alone = cluster.from_environment(indexed_pod(0, completions=1))
  assert alone == cluster.ClusterRole(alone="a Kubernetes Indexed Job of 1 pod (K8S_JOB_COMPLETIONS=1)")
  assert (alone.type, alone.is_distributed, alone.is_chief) == ("local", False, True)
  assert cluster.from_environment(jobset_pod(0, 0, replicas=1, completions=1), source="k8s").alone.startswith(
      "a Kubernetes JobSet of 1 pod")
  config = load_config("digits_cnn")
  config.strategy = "multi_worker_mirrored"
  with pytest.raises(ConfigError) as raised:
    distribute_rules.check_role(config, alone)
  assert str(raised.value) == (
      "strategy 'multi_worker_mirrored' needs 2 or more workers, and this process found a Kubernetes Indexed Job of "
      "1 pod (K8S_JOB_COMPLETIONS=1): start 2 or more (completions and parallelism of the Job, -np of the launcher), "
      "or train on one machine with strategy=mirrored")


@pytest.mark.parametrize("env, message", [
    ({k: v for k, v in indexed_pod(1).items() if k != "K8S_JOB_COMPLETIONS"},
     "cluster.source is k8s but K8S_JOB_COMPLETIONS is not set (set it in the container's env to the Job's "
     "completions (= parallelism)"),
    ({}, "cluster.source is k8s but JOB_COMPLETION_INDEX is not set (run the pods as an Indexed Job"),
    ({k: v for k, v in indexed_pod(1).items() if k != "K8S_SERVICE"},
     "K8S_SERVICE is not set (set it in the container's env to the headless Service's name, which is the pod "
     "template's subdomain)"),
    (indexed_pod(3), "Kubernetes environment is inconsistent: JOB_COMPLETION_INDEX=3, K8S_JOB_COMPLETIONS=3"),
    (indexed_pod(1, completions="two"), "K8S_JOB_COMPLETIONS is not a number: 'two'"),
    ({**indexed_pod(1), "HOSTNAME": "node-7"}, "HOSTNAME 'node-7' is not <job name>-1 (JOB_COMPLETION_INDEX)"),
    (jobset_pod(2, 0), "JobSet environment is inconsistent: JOB_INDEX=2, REPLICATED_JOB_REPLICAS=2"),
    ({**jobset_pod(1, 0), "HOSTNAME": "js-workers-0-0"},
     "JobSet environment is inconsistent: HOSTNAME 'js-workers-0-0' is not <jobset>-<replicated job>-<JOB_INDEX>-"
     "<JOB_COMPLETION_INDEX> = 'js-workers-1-0'; set it from the pod's label jobset.sigs.k8s.io/job-index"),
    ({k: v for k, v in jobset_pod(1, 0).items() if k != "JOB_INDEX"},
     "JOB_INDEX is not set (set it from the pod's label jobset.sigs.k8s.io/job-index"),
    (indexed_pod(1, K8S_CLUSTER_DOMAIN="cluster.local"), "K8S_CLUSTER_DOMAIN is set but K8S_NAMESPACE is not"),
])
def test_a_missing_or_wrong_variable_is_one_line_naming_it(env, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    cluster.from_environment(env, source="k8s")


def test_cluster_source_k8s_and_its_port_are_checked_settings():
  config = load_config("digits_cnn")
  config.cluster.source, config.cluster.k8s_port = "k8s", 2222
  rules.check(config)
  config.cluster.k8s_port = 0
  with pytest.raises(ConfigError, match=r"cluster.k8s_port must be a port number in 1..65535, got 0"):
    rules.check(config)


# Two pods for real: each in its own network namespace on a bridge, the headless Service's DNS records played by an
# /etc/hosts bind-mounted in a private mount namespace (unshare: no root, nothing outside changes).

NETWORK = r"""
set -e
ip link set lo up && ip link add br0 type bridge && ip link set br0 up
echo 127.0.0.1 localhost > "$DIR/hosts"
for i in 0 1; do echo 10.9.0.1$i digits-mwms-$i.digits-mwms.team.svc >> "$DIR/hosts"; done
mount --bind "$DIR/hosts" /etc/hosts
for i in 0 1; do
  ip link add v$i type veth peer name p$i && ip link set v$i master br0 && ip link set v$i up
  unshare -n --fork bash "$DIR/pod.sh" $i > "$DIR/pod$i.log" 2>&1 &
  pid[$i]=$!
  for _ in $(seq 100); do  # until the pod has its own network namespace
    [ "$(readlink /proc/${pid[$i]}/ns/net)" != "$(readlink /proc/$$/ns/net)" ] && break; sleep 0.1
  done
  ip link set p$i netns ${pid[$i]}
done
wait ${pid[0]} && wait ${pid[1]}
"""
POD = r"""
for _ in $(seq 100); do ip link show p$1 > /dev/null 2>&1 && break; sleep 0.1; done
ip link set lo up && ip addr add 10.9.0.1$1/24 dev p$1 && ip link set p$1 up
cd "$REPO" && exec env -u TF_CONFIG HOSTNAME=digits-mwms-$1 JOB_COMPLETION_INDEX=$1 K8S_JOB_COMPLETIONS=2 \
  K8S_SERVICE=digits-mwms K8S_NAMESPACE=team CUDA_VISIBLE_DEVICES= "$PY" main.py --config=configs/digits_cnn.py \
  --workdir="$DIR/workdir" --config.strategy=multi_worker_mirrored --config.cluster.source=k8s \
  --config.train.steps=20 --config.train.steps_per_loop=5 --config.cluster.startup_timeout_seconds=120
"""


def _private_network_works():
  probe = "ip link add br0 type bridge && ip link add v0 type veth peer name p0"
  try:
    return subprocess.run(["unshare", "-rmn", "--fork", "sh", "-c", probe], capture_output=True,
                          timeout=30).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


@pytest.mark.e2e
@pytest.mark.skipif(not _private_network_works(), reason="needs unshare with user namespaces, ip and veth")
def test_two_pods_train_together_from_their_kubernetes_names(tmp_path):
  (tmp_path / "pod.sh").write_text(POD)
  env = {**os.environ, "DIR": str(tmp_path), "REPO": REPO, "PY": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "3"}
  done = subprocess.run(["unshare", "-rmn", "--fork", "bash", "-c", NETWORK], env=env, capture_output=True,
                        text=True, timeout=400)
  logs = [(tmp_path / f"pod{i}.log").read_text() for i in (0, 1)]
  assert done.returncode == 0, done.stderr[-2000:] + logs[0][-2000:] + logs[1][-2000:]
  names = "['digits-mwms-0.digits-mwms.team.svc:2222', 'digits-mwms-1.digits-mwms.team.svc:2222']"
  assert all(f"Kubernetes pod {i} of 2: cluster {names}" in log for i, log in enumerate(logs))
  summary = json.loads((tmp_path / "workdir" / "summary.json").read_text())
  assert summary["replicas"] == 2 and summary["step"] == 20
