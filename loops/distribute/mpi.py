"""Which MPI launcher started this process, and its rank, size, local rank and job key (standard library only).

Open MPI's `mpirun` (OMPI_COMM_WORLD_*), MPICH's Hydra `mpiexec`/`mpirun` (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) and
`horovodrun` with Gloo (HOROVOD_*; horovodrun with MPI runs Open MPI's or MPICH's mpirun, read as those). Under SLURM
an mpirun starts its ranks through daemons that srun started (one per node): the SLURM step variables then
describe the daemons, not the ranks, so the launcher's own variables are read first (loops/distribute/cluster.py).
"""

import dataclasses
import os
import re

from errors import ConfigError

# launcher -> (rank, size, local rank) variables; Hydra's MPI_LOCALRANKID tells it from SLURM's PMI-2 plugin
# (srun --mpi=pmi2 also sets PMI_RANK and PMI_SIZE: that is SLURM's own start, read as SLURM).
VARIABLES = {
    "open_mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "hydra": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    "horovod": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
}
LOCAL_SIZES = {"open_mpi": "OMPI_COMM_WORLD_LOCAL_SIZE", "hydra": "MPI_LOCALNRANKS", "horovod": "HOROVOD_LOCAL_SIZE"}
NAMES = {"open_mpi": "Open MPI mpirun", "hydra": "MPICH (Hydra) mpiexec", "horovod": "horovodrun (Gloo)"}
# The job of a resource manager, for a launcher that names none of its own: (variable, step variable or None).
RESOURCE_MANAGER_JOBS = (("SLURM_JOB_ID", "SLURM_STEP_ID"), ("PBS_JOBID", None), ("LSB_JOBID", None),
                         ("FLUX_JOB_ID", None), ("COBALT_JOBID", None))


@dataclasses.dataclass(frozen=True)
class Launch:
  launcher: str  # a key of VARIABLES
  rank: int
  size: int
  local_rank: int
  local_size: int  # ranks on this machine (1 when the launcher does not say)
  job_key: str  # names this launch's rendezvous folder: distinct for every launch (see job_key)
  job_key_is_unique: bool = True  # False: no launcher job id; the key can repeat (a warning says so)


def detect(environ):
  """The launcher whose variables are all set in environ (Open MPI, then Hydra, then horovodrun), or None."""
  for launcher, names in VARIABLES.items():
    if all(environ.get(name, "").strip() for name in names[:2]) and (launcher != "hydra" or names[2] in environ):
      return launcher
  return None


def from_environment(environ):
  """The Launch of this process; ConfigError when no launcher's variables are set or they are not numbers."""
  launcher = detect(environ)
  if launcher is None:
    raise ConfigError("cluster.source is mpi but no MPI launcher's variables are set (start the training with "
                      "`mpirun -np N`, `mpiexec -n N` or `horovodrun -np N`; read: "
                      + "; ".join(f"{NAMES[k]}: {', '.join(v)}" for k, v in VARIABLES.items()) + ")")
  rank_name, size_name, local_name = VARIABLES[launcher]
  rank, size = _number(environ, rank_name), _number(environ, size_name)
  local_rank = _number(environ, local_name) if environ.get(local_name, "").strip() else 0
  local_size = _number(environ, LOCAL_SIZES[launcher]) if environ.get(LOCAL_SIZES[launcher], "").strip() else 1
  if size < 1 or not 0 <= rank < size:
    raise ConfigError(f"{NAMES[launcher]} environment is inconsistent: {rank_name}={rank}, {size_name}={size}")
  key, unique = job_key(launcher, environ, size)
  return Launch(launcher, rank, size, local_rank, local_size, key, unique)


def binding_warning(usable_cores=None, machine_cores=None):
  """A warning when the launcher bound this rank to one core of several (Open MPI binds each rank to a core when
  -np <= 2, to a socket above; Hydra with -bind-to), else None: one process drives all of a machine's devices."""
  if usable_cores is None:
    usable_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
  machine_cores = (os.cpu_count() or 1) if machine_cores is None else machine_cores
  if usable_cores != 1 or machine_cores < 2:
    return None
  return (f"the MPI launcher bound this rank to 1 of the machine's {machine_cores} cores: its input pipeline and "
          "TensorFlow's threads share that core; start with `mpirun --bind-to none` (MPICH: `-bind-to none`)")


def shared_gpus_warning(local_size, gpus):
  """A warning when several ranks share a machine and each sees all its GPUs (Horovod's one rank per GPU, without
  pinning): every rank would take every GPU. None otherwise (one rank per machine, or ranks already pinned)."""
  if local_size < 2 or gpus < local_size:
    return None
  return (f"{local_size} ranks run on this machine and each takes all its {gpus} GPUs (multi_worker_mirrored drives "
          "a machine's GPUs from one process): start one rank per machine (mpirun --map-by ppr:1:node, mpiexec "
          "-ppn 1, horovodrun -H host:1)")


def _number(environ, name):
  try:
    return int(environ[name])
  except ValueError:
    raise ConfigError(f"{name} is not a number: {environ[name]!r}") from None


def job_key(launcher, environ, size):
  """(key, unique): a folder name that differs for every launch, from the launcher's own job id.

  Open MPI: its job id (OMPI_MCA_ess_base_jobid 4.x, PMIX_NAMESPACE 5.x, else PMIX_ID's namespace) and the random
  per-launch transport key mpirun hands every rank (OMPI_MCA_orte_precondition_transports, 4.x): the job id alone
  is a hash of mpirun's host and pid, which repeats in containers. horovodrun: its rendezvous server's address and
  port. Hydra sets no job id: the resource manager's job (and SLURM step) is taken, else only the launcher and the
  size; such keys are not unique (unique=False) and rest on every rank removing its file once the cluster started.
  """
  parts = []
  if launcher == "open_mpi":
    job = (environ.get("OMPI_MCA_ess_base_jobid") or environ.get("PMIX_NAMESPACE")
           or environ.get("PMIX_ID", "").rpartition(".")[0])
    parts = [job, environ.get("OMPI_MCA_orte_precondition_transports", "")] if job else []
  elif launcher == "horovod" and environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT"):
    parts = [environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", ""), environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]]
  unique = bool(parts)
  if not unique:
    parts = [f"size{size}"] + _resource_manager_job(environ)
  return _safe("-".join([launcher] + [p for p in parts if p])), unique


def _resource_manager_job(environ):
  for job, step in RESOURCE_MANAGER_JOBS:
    if environ.get(job):
      return [environ[job]] + ([environ[step]] if step and environ.get(step) else [])
  return []


def _safe(name):
  """name with every character but letters, digits, '.', '_' and '-' replaced by '_' (a folder name)."""
  return re.sub(r"[^A-Za-z0-9._-]", "_", name)
