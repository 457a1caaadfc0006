"""Who am I? The role of this process from TF_CONFIG, SLURM, an MPI launcher or a Kubernetes Indexed Job: type,
index, cluster, chief or not."""

import dataclasses
import json
import os

from absl import logging

from errors import ConfigError
from loops import private_apis
from loops.distribute import k8s
from loops.distribute import mpi
from loops.distribute import rendezvous


JOBS = ("chief", "worker", "ps", "evaluator")  # what tf.distribute accepts; "master" is read as "chief"


@dataclasses.dataclass(frozen=True)
class ClusterRole:
  type: str = "local"  # local (no cluster), chief, worker, ps, evaluator
  index: int = 0
  cluster: dict = dataclasses.field(default_factory=dict)  # the training cluster: never an "evaluator" job
  rendezvous_file: str = ""  # MPI: this rank's address file, removed once its peers answer (rendezvous.py)
  alone: str = ""  # local because the launcher found one process: what it found ("a Kubernetes Job of 1 pod")

  @property
  def is_chief(self):
    """The chief writes summaries, config.json and the real checkpoint series; the others only take part."""
    if self.type in ("local", "chief"):
      return True
    return self.type == "worker" and self.index == 0 and "chief" not in self.cluster

  @property
  def is_evaluator(self):
    """A side process that evaluates the training cluster's checkpoints; it never joins the cluster itself."""
    return self.type == "evaluator"

  @property
  def is_distributed(self):
    """This process is one process of a multi-process training cluster (an evaluator only watches one)."""
    return bool(self.cluster) and not self.is_evaluator

  @property
  def worker_index(self):
    """This process's place among the training workers (a chief counts first)."""
    return self.index + (1 if self.type == "worker" and "chief" in self.cluster else 0)

  @property
  def num_workers(self):
    return len(self.cluster.get("worker", [])) + len(self.cluster.get("chief", [])) or 1


SOURCES = ("auto", "tf_config", "slurm", "mpi", "k8s", "local")
# Derived SLURM ports: 199 blocks of 64 in 20000-32735, below Linux's ephemeral range (32768-60999); a job's block
# follows from its SLURM_JOB_ID (each array task has its own), so 199 consecutive jobs on one node never share one.
SLURM_PORT_FIRST, SLURM_PORTS_PER_JOB, SLURM_PORT_BLOCKS = 20000, 64, 199


def from_environment(environ=None, source="auto", slurm_port_base=None, workdir=None, startup_timeout_seconds=600.0,
                     k8s_port=k8s.DEFAULT_PORT):
  """The ClusterRole of this process.

  source: "tf_config" reads TF_CONFIG, "slurm" reads srun's variables, "mpi" an MPI launcher's (mpi.py), "k8s" a
  Kubernetes Indexed Job's or JobSet's (k8s.py), "local" ignores them all; "auto" takes TF_CONFIG when it is set,
  else an MPI launcher's variables (an mpirun inside an sbatch allocation: its SLURM step variables describe
  mpirun's daemons, not the ranks), else SLURM when this process is one task of an srun step of several tasks,
  else Kubernetes when JOB_COMPLETION_INDEX and K8S_JOB_COMPLETIONS are set, else local (a batch script's own
  shell, even with --ntasks=2, is one process: it trains locally).
  slurm_port_base: task i of a node listens on base + i; None = derived from SLURM_JOB_ID (slurm_port_base()).
  workdir, startup_timeout_seconds: where and how long MPI ranks exchange their addresses (rendezvous.py).
  k8s_port: the port every pod of a Kubernetes Job listens on.
  """
  environ = os.environ if environ is None else environ
  if source == "local":
    return ClusterRole()
  no_tf_config = not environ.get("TF_CONFIG", "").strip()
  if source == "mpi" or (source == "auto" and no_tf_config and mpi.detect(environ)):
    return from_mpi(environ, workdir, startup_timeout_seconds)
  if source == "slurm" or (source == "auto" and no_tf_config and in_srun_step_of_several_tasks(environ)):
    return from_slurm(environ, slurm_port_base)
  if source == "k8s" or (source == "auto" and no_tf_config and k8s.detect(environ)):
    return from_k8s(environ, k8s_port)
  return from_tf_config(environ)


def from_mpi(environ, workdir, timeout_seconds):
  """One worker per rank (rank 0 the chief-like worker 0), addresses exchanged through the workdir; one rank is
  no cluster (a local run)."""
  launch = mpi.from_environment(environ)
  if launch.size == 1:
    return ClusterRole(alone=f"{mpi.NAMES[launch.launcher]} started 1 rank")
  if not workdir:
    raise ConfigError(f"{mpi.NAMES[launch.launcher]} started {launch.size} ranks but no workdir was given: the "
                      "ranks exchange their addresses through it")
  if not launch.job_key_is_unique:
    logging.warning("%s names no job id: the ranks meet under the key '%s' (launcher, size, resource manager job); "
                    "files a killed earlier launch left in %s would be read: remove that folder if the start "
                    "fails", mpi.NAMES[launch.launcher], launch.job_key, rendezvous.folder(workdir, launch.job_key))
  for warning in (mpi.binding_warning(), mpi.shared_gpus_warning(launch.local_size, _gpu_count())):
    if warning:
      logging.warning("%s", warning)
  addresses, own_file = rendezvous.exchange(workdir, launch.job_key, launch.rank, launch.size, timeout_seconds)
  logging.info("%s rank %d of %d: cluster %s", mpi.NAMES[launch.launcher], launch.rank, launch.size, addresses)
  return ClusterRole(type="worker", index=launch.rank, cluster={"worker": addresses}, rendezvous_file=own_file)


def from_k8s(environ, port=k8s.DEFAULT_PORT):
  """One worker per pod of an Indexed Job or JobSet (k8s.py), index 0 the chief-like worker 0, all on `port`; one
  pod is no cluster (a local run)."""
  pods = k8s.from_environment(environ)
  if len(pods.hosts) == 1:
    return ClusterRole(alone=f"a Kubernetes {'JobSet' if environ.get(k8s.JOBSET, '').strip() else 'Indexed Job'} "
                             f"of 1 pod ({k8s.COMPLETIONS}=1)")
  addresses = [f"{host}:{port}" for host in pods.hosts]
  logging.info("Kubernetes pod %d of %d: cluster %s", pods.index, len(addresses), addresses)
  return ClusterRole(type="worker", index=pods.index, cluster={"worker": addresses})


def _gpu_count():
  """GPUs this process sees (lists devices without starting TensorFlow's runtime)."""
  import tensorflow as tf

  return len(tf.config.list_physical_devices("GPU"))


def in_srun_step_of_several_tasks(environ):
  """srun sets SLURM_STEP_NUM_TASKS in every process of a step; the batch shell (sbatch) and salloc have only the
  job's SLURM_NTASKS, which counts tasks that do not exist until srun starts them."""
  try:
    return int(environ.get("SLURM_STEP_NUM_TASKS") or 1) > 1
  except ValueError:
    raise ConfigError(f"SLURM_STEP_NUM_TASKS is not a number: {environ['SLURM_STEP_NUM_TASKS']!r}") from None


def slurm_port_base(environ, explicit=None):
  """explicit when given, else 20000 + (SLURM_JOB_ID % 199) * 64: two jobs (or array tasks) on one node differ."""
  if explicit is not None:
    return explicit
  job_id = environ.get("SLURM_JOB_ID", "")
  if not job_id.isdigit():
    raise ConfigError(f"cannot derive SLURM ports: SLURM_JOB_ID is {job_id!r}, not a job number; set "
                      "cluster.slurm_port_base")
  return SLURM_PORT_FIRST + int(job_id) % SLURM_PORT_BLOCKS * SLURM_PORTS_PER_JOB


def from_slurm(environ, port_base=None):
  """One worker per srun task, ports port_base + local task number; tasks numbered node by node (block)."""
  def get(name):
    if environ.get(name):
      return environ[name]
    raise ConfigError(f"cluster.source is slurm but {name} is not set (start the training with srun; a batch "
                      "script's own shell is not a task of a step)")

  try:
    rank = int(get("SLURM_PROCID"))
    num_tasks = int(get("SLURM_STEP_NUM_TASKS"))
    hosts = private_apis.expand_hostlist(get("SLURM_STEP_NODELIST"))
    tasks_per_node = private_apis.expand_tasks_per_node(get("SLURM_STEP_TASKS_PER_NODE"))
  except ValueError as e:
    raise ConfigError(f"cannot read the SLURM environment: {e}") from None
  layout = list(zip(hosts, tasks_per_node))
  slots = sum(count for _, count in layout)
  if slots != num_tasks or not 0 <= rank < num_tasks:
    raise ConfigError(f"SLURM environment is inconsistent: {num_tasks} tasks, {slots} task slots on "
                      f"nodes {hosts} ({tasks_per_node} per node), SLURM_PROCID={rank}")
  base = _checked_port_base(slurm_port_base(environ, port_base), max(tasks_per_node), derived=port_base is None)
  addresses = [f"{host}:{base + i}" for host, count in layout for i in range(count)]
  return ClusterRole(type="worker", index=rank, cluster={"worker": addresses})


def _checked_port_base(base, tasks_on_a_node, derived):
  """base, if every process of a node gets a port of its own (within the job's block of 64 when derived)."""
  last = base + tasks_on_a_node - 1
  if derived and tasks_on_a_node > SLURM_PORTS_PER_JOB:
    raise ConfigError(f"{tasks_on_a_node} tasks on a node need more than the {SLURM_PORTS_PER_JOB} ports derived "
                      "from SLURM_JOB_ID; set cluster.slurm_port_base")
  if base < 1 or last > 65535:
    raise ConfigError(f"cluster.slurm_port_base {base} gives ports {base}..{last}; they must lie in 1..65535")
  return base


def from_tf_config(environ):
  """Parses TF_CONFIG (if set) into a ClusterRole; a malformed TF_CONFIG raises ConfigError naming the field.

  Accepts what cluster managers write: extra keys ("environment": "cloud", "job", task "trial"), a "master" job
  for the chief (SageMaker, AI Platform), and an evaluator process whether or not its job is in "cluster"
  (training-operator TFJob lists it, AI Platform does not). Vertex AI's CLUSTER_SPEC is not read.
  """
  raw = environ.get("TF_CONFIG", "").strip()
  if not raw:
    return ClusterRole()
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
  cluster, job = _master_is_chief(_check_jobs(cluster), task["type"])
  index = task.get("index", 0)
  if job not in cluster and job != "evaluator":
    raise ConfigError(f"TF_CONFIG task.type '{job}' is not a job of the cluster; jobs: {', '.join(cluster)}")
  count = len(cluster.get(job, ()))
  if not isinstance(index, int) or isinstance(index, bool) or index < 0 or (count and index >= count):
    raise ConfigError(f"TF_CONFIG task.index {index!r} is out of range: job '{job}' has {count} address(es)")
  training = {name: addresses for name, addresses in cluster.items() if name != "evaluator"}
  if not training:
    raise ConfigError("TF_CONFIG cluster has no training job (chief, worker or ps), only an evaluator")
  return ClusterRole(type=job, index=index, cluster=training)


def _master_is_chief(cluster, job):
  """SageMaker and AI Platform (legacy runtimes) name the chief "master"; every process renames it alike."""
  if "master" not in cluster:
    return cluster, job
  if "chief" in cluster:
    raise ConfigError("TF_CONFIG cluster has both a 'master' and a 'chief' job; name the chief once")
  cluster = {("chief" if name == "master" else name): addresses for name, addresses in cluster.items()}
  return cluster, "chief" if job == "master" else job


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
      raise ConfigError(f"TF_CONFIG cluster job '{job}' has {len(cluster[job])} addresses; a cluster has one chief")
  return {job: addresses for job, addresses in cluster.items() if addresses}
