"""This pod's place in a Kubernetes Indexed Job or JobSet, and every worker's DNS name (standard library only).

An Indexed Job (`completionMode: Indexed`) gives each pod its index (JOB_COMPLETION_INDEX, 0..completions-1) and
the hostname `<job>-<index>`; with the pod template's `subdomain` naming a headless Service, pod i answers at
`<job>-<i>.<service>`. A JobSet's pods are `<jobset>-<replicated job>-<job index>-<pod index>.<subdomain>`, the
subdomain being the JobSet's name unless `spec.network.subdomain` says otherwise. A pod cannot read its Job's
completions, so the manifest passes them (launch/k8s/indexed-job.yaml, launch/k8s/jobset.yaml).
"""

import dataclasses

from errors import ConfigError

INDEX = "JOB_COMPLETION_INDEX"  # Kubernetes sets it in every pod of an Indexed Job (a JobSet's Jobs are Indexed)
COMPLETIONS = "K8S_JOB_COMPLETIONS"  # the manifest: the Job's completions (= parallelism)
SERVICE = "K8S_SERVICE"  # the manifest: the headless Service = the pod template's subdomain (JobSet: optional)
NAMESPACE = "K8S_NAMESPACE"  # optional (downward API metadata.namespace): <host>.<service>.<namespace>.svc
CLUSTER_DOMAIN = "K8S_CLUSTER_DOMAIN"  # optional, with K8S_NAMESPACE: appended to it (e.g. cluster.local)
JOBSET = "JOBSET_NAME"  # set: a JobSet's pod; the manifest sets these from the pod's jobset.sigs.k8s.io/ labels
REPLICATED_JOB, JOB_INDEX, REPLICAS = "REPLICATED_JOB_NAME", "JOB_INDEX", "REPLICATED_JOB_REPLICAS"
MAX_HOSTNAME = 63  # a longer pod hostname is cut by Kubernetes: not compared
DEFAULT_PORT = 2222  # cluster.k8s_port: every pod has its own network namespace, so one port serves all

HOW = {
    INDEX: "run the pods as an Indexed Job (completionMode: Indexed) or a JobSet: Kubernetes sets it",
    COMPLETIONS: "set it in the container's env to the Job's completions (= parallelism), as "
                 "launch/k8s/indexed-job.yaml does",
    SERVICE: "set it in the container's env to the headless Service's name, which is the pod template's subdomain",
    "HOSTNAME": "an Indexed Job's pod has the hostname <job name>-<index>",
    REPLICATED_JOB: "set it from the pod's label jobset.sigs.k8s.io/replicatedjob-name, as launch/k8s/jobset.yaml does",
    JOB_INDEX: "set it from the pod's label jobset.sigs.k8s.io/job-index, as launch/k8s/jobset.yaml does",
    REPLICAS: "set it from the pod's label jobset.sigs.k8s.io/replicatedjob-replicas, as launch/k8s/jobset.yaml does",
}


@dataclasses.dataclass(frozen=True)
class Pods:
  index: int  # this pod's place among all the workers (0 is the chief)
  hosts: tuple  # every worker's DNS name, in index order


def detect(environ):
  """An Indexed Job's (or JobSet's) pod whose manifest gave the completions: both variables set."""
  return all(environ.get(name, "").strip() for name in (INDEX, COMPLETIONS))


def from_environment(environ):
  """The Pods of this Job (or of this JobSet's replicated job); ConfigError naming a missing or wrong variable."""
  index, completions = _number(environ, INDEX), _number(environ, COMPLETIONS)
  if completions < 1 or not 0 <= index < completions:
    raise ConfigError(f"Kubernetes environment is inconsistent: {INDEX}={index}, {COMPLETIONS}={completions}; "
                      f"{HOW[COMPLETIONS]}")
  if environ.get(JOBSET, "").strip():
    return _jobset(environ, index, completions)
  return _indexed_job(environ, index, completions)


def _indexed_job(environ, index, completions):
  hostname = _get(environ, "HOSTNAME")
  job, _, own = hostname.rpartition("-")
  if not job or own != str(index):
    raise ConfigError(f"cannot name the Job's pods: HOSTNAME {hostname!r} is not <job name>-{index} ({INDEX}); "
                      "an Indexed Job's pod has that hostname unless it sets hostNetwork or spec.hostname: remove them")
  service = _get(environ, SERVICE)
  return Pods(index, tuple(_qualified(f"{job}-{i}.{service}", environ) for i in range(completions)))


def _jobset(environ, pod_index, completions):
  """Every Job of the replicated job runs `completions` workers; worker j * completions + p is pod p of Job j."""
  jobset, replicated, job_index = environ[JOBSET].strip(), _get(environ, REPLICATED_JOB), _number(environ, JOB_INDEX)
  replicas = _number(environ, REPLICAS) if environ.get(REPLICAS, "").strip() else 1
  if replicas < 1 or not 0 <= job_index < replicas:
    raise ConfigError(f"JobSet environment is inconsistent: {JOB_INDEX}={job_index}, {REPLICAS}={replicas}; "
                      f"{HOW[REPLICAS]}")
  own = f"{jobset}-{replicated}-{job_index}-{pod_index}"
  hostname = environ.get("HOSTNAME", "").strip()
  if hostname and len(own) <= MAX_HOSTNAME and hostname != own:
    raise ConfigError(f"JobSet environment is inconsistent: HOSTNAME {hostname!r} is not <jobset>-<replicated job>-"
                      f"<{JOB_INDEX}>-<{INDEX}> = {own!r}; {HOW[JOB_INDEX]} and {HOW[REPLICATED_JOB][0].lower()}"
                      f"{HOW[REPLICATED_JOB][1:]}")
  service = environ.get(SERVICE, "").strip() or jobset
  hosts = tuple(_qualified(f"{jobset}-{replicated}-{j}-{p}.{service}", environ)
                for j in range(replicas) for p in range(completions))
  return Pods(job_index * completions + pod_index, hosts)


def _qualified(name, environ):
  """name, or name.<namespace>.svc[.<cluster domain>] when K8S_NAMESPACE is set."""
  namespace, domain = environ.get(NAMESPACE, "").strip(), environ.get(CLUSTER_DOMAIN, "").strip()
  if domain and not namespace:
    raise ConfigError(f"{CLUSTER_DOMAIN} is set but {NAMESPACE} is not: set it from the pod's metadata.namespace "
                      "(downward API), or unset both for short names")
  if not namespace:
    return name
  return f"{name}.{namespace}.svc" + (f".{domain}" if domain else "")


def _get(environ, name):
  value = environ.get(name, "").strip()
  if not value:
    raise ConfigError(f"cluster.source is k8s but {name} is not set ({HOW[name]})")
  return value


def _number(environ, name):
  value = _get(environ, name)
  try:
    return int(value)
  except ValueError:
    raise ConfigError(f"{name} is not a number: {value!r} ({HOW[name]})") from None
