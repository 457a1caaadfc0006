"""Who am I? The task of this process from TF_CONFIG or SLURM: type, index, cluster, chief or not."""

import dataclasses
import json
import os

from errors import ConfigError


JOBS = ("chief", "worker", "ps", "evaluator")  # what tf.distribute accepts; "master" is read as "chief"


@dataclasses.dataclass(frozen=True)
class Task:
  type: str = "local"  # local (no cluster), chief, worker, ps, evaluator
  index: int = 0
  cluster: dict = dataclasses.field(default_factory=dict)  # the training cluster: never an "evaluator" job

  @property
  def is_chief(self):
    """The chief writes summaries, config.json and the real checkpoint series; the others only take part."""
    if self.type in ("local", "chief"):
      return True
    return self.type == "worker" and self.index == 0 and "chief" not in self.cluster

  @property
  def is_evaluator(self):
    """A side task that evaluates the training cluster's checkpoints; it never joins the cluster itself."""
    return self.type == "evaluator"

  @property
  def is_distributed(self):
    """This process is one task of a multi-process training cluster (an evaluator only watches one)."""
    return bool(self.cluster) and not self.is_evaluator

  @property
  def worker_index(self):
    """This task's place among the training workers (a chief counts first)."""
    return self.index + (1 if self.type == "worker" and "chief" in self.cluster else 0)

  @property
  def num_workers(self):
    return len(self.cluster.get("worker", [])) + len(self.cluster.get("chief", [])) or 1


SOURCES = ("auto", "tf_config", "slurm", "local")


def from_environment(environ=None, source="auto", slurm_port_base=8888):
  """The Task of this process.

  source: "tf_config" reads TF_CONFIG, "slurm" reads srun's variables, "local" ignores both, "auto" takes
  TF_CONFIG when it is set, else SLURM when this process is one of several srun tasks, else local.
  """
  environ = os.environ if environ is None else environ
  if source == "local":
    return Task()
  if source == "slurm" or (source == "auto" and not environ.get("TF_CONFIG", "").strip()
                           and int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1) > 1):
    return from_slurm(environ, slurm_port_base)
  return from_tf_config(environ)


def from_slurm(environ, port_base):
  """One worker per srun task, ports port_base + local task number; tasks numbered node by node (block)."""
  from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as slurm

  def get(*names):
    for name in names:
      if environ.get(name):
        return environ[name]
    raise ConfigError(f"cluster.source is slurm but {names[0]} is not set (run the job under srun)")

  try:
    rank = int(get("SLURM_PROCID"))
    num_tasks = int(get("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    hosts = slurm.expand_hostlist(get("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    tasks_per_node = slurm.expand_tasks_per_node(get("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
  except ValueError as e:
    raise ConfigError(f"cannot read the SLURM environment: {e}") from None
  addresses = [f"{host}:{port_base + i}" for host, count in zip(hosts, tasks_per_node) for i in range(count)]
  if len(addresses) != num_tasks or not 0 <= rank < num_tasks:
    raise ConfigError(f"SLURM environment is inconsistent: {num_tasks} tasks, {len(addresses)} task slots on "
                      f"nodes {hosts} ({tasks_per_node} per node), SLURM_PROCID={rank}")
  return Task(type="worker", index=rank, cluster={"worker": addresses})


def from_tf_config(environ):
  """Parses TF_CONFIG (if set) into a Task; a malformed TF_CONFIG raises ConfigError naming the field.

  Accepts what cluster managers write: extra keys ("environment": "cloud", "job", task "trial"), a "master" job
  for the chief (SageMaker, AI Platform), and an evaluator task whether or not its job is in "cluster"
  (training-operator TFJob lists it, AI Platform does not). Vertex AI's CLUSTER_SPEC is not read.
  """
  raw = environ.get("TF_CONFIG", "").strip()
  if not raw:
    return Task()
  try:
    spec = json.loads(raw)
  except json.JSONDecodeError as e:
    raise ConfigError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos})") from None
  if not isinstance(spec, dict):
    raise ConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
  cluster, task = spec.get("cluster"), spec.get("task")
  if not isinstance(cluster, dict) or not cluster:
    raise ConfigError("TF_CONFIG has no 'cluster' (e.g. {\"worker\": [\"host:port\", ...]})")
  if not isinstance(task, dict) or not isinstance(task.get("type"), str):
    raise ConfigError("TF_CONFIG has no 'task' with a 'type' (e.g. {\"type\": \"worker\", \"index\": 0})")
  cluster, task_type = _master_is_chief(_check_jobs(cluster), task["type"])
  index = task.get("index", 0)
  if task_type not in cluster and task_type != "evaluator":
    raise ConfigError(f"TF_CONFIG task.type '{task_type}' is not a job of the cluster; jobs: {', '.join(cluster)}")
  tasks = len(cluster.get(task_type, ()))
  if not isinstance(index, int) or isinstance(index, bool) or index < 0 or (tasks and index >= tasks):
    raise ConfigError(f"TF_CONFIG task.index {index!r} is out of range: job '{task_type}' has {tasks} task(s)")
  training = {job: addresses for job, addresses in cluster.items() if job != "evaluator"}
  if not training:
    raise ConfigError("TF_CONFIG cluster has no training job (chief, worker or ps), only an evaluator")
  return Task(type=task_type, index=index, cluster=training)


def _master_is_chief(cluster, task_type):
  """SageMaker and AI Platform (legacy runtimes) name the chief "master"; every task renames it alike."""
  if "master" not in cluster:
    return cluster, task_type
  if "chief" in cluster:
    raise ConfigError("TF_CONFIG cluster has both a 'master' and a 'chief' job; name the chief once")
  cluster = {("chief" if job == "master" else job): addresses for job, addresses in cluster.items()}
  return cluster, "chief" if task_type == "master" else task_type


def _check_jobs(cluster):
  """The cluster without empty jobs (a TFJob replica type scaled to 0 is written as [])."""
  for job, addresses in cluster.items():
    if job not in JOBS + ("master",):
      raise ConfigError(f"TF_CONFIG cluster job '{job}' is not one TensorFlow knows; valid: master, "
                        f"{', '.join(JOBS)}")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
      raise ConfigError(f"TF_CONFIG cluster job '{job}' must be a list of \"host:port\" strings, got {addresses!r}")
  for job in ("chief", "master"):
    if len(cluster.get(job, ())) > 1:
      raise ConfigError(f"TF_CONFIG cluster job '{job}' has {len(cluster[job])} tasks; a cluster has one chief")
  return {job: addresses for job, addresses in cluster.items() if addresses}
