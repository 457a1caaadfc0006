"""MPI launchers: Open MPI / Hydra / horovodrun environments, the address rendezvous through the workdir (threads
with fake environments), and one real `mpirun -np 2` training that matches `launch.local --workers 2`."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError, WorkerLostError
from loops import rules
from loops.distribute import cluster
from loops.distribute import mpi
from loops.distribute import rendezvous
from loops.distribute import startup
from tests.conftest import REPO, load_config

PY = sys.executable


def open_mpi(rank, size=2, jobid="434372609", transports="16bdeb9f-13c5feb7", **extra):
  """What Open MPI 4.1's mpirun sets (checked on Debian 12: `mpirun -np 2 env`)."""
  return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
          "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_MCA_ess_base_jobid": jobid,
          "OMPI_MCA_orte_precondition_transports": transports, "PMIX_ID": f"{jobid}.{rank}", "PMIX_RANK": str(rank),
          **extra}


def test_open_mpi_rank_size_local_rank_and_a_key_of_job_id_and_transport_key():
  launch = mpi.from_environment(open_mpi(1, size=4, OMPI_COMM_WORLD_LOCAL_RANK="0"))
  assert (launch.launcher, launch.rank, launch.size, launch.local_rank) == ("open_mpi", 1, 4, 0)
  assert launch.job_key == "open_mpi-434372609-16bdeb9f-13c5feb7" and launch.job_key_is_unique
  five = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "prterun-vm-77@1"}
  assert mpi.from_environment(five).job_key == "open_mpi-prterun-vm-77_1"  # Open MPI 5: the PMIx namespace


def test_hydra_has_no_job_id_its_key_takes_the_resource_managers_job_and_is_not_unique():
  hydra = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "PMI_FD": "5"}
  launch = mpi.from_environment(hydra)
  assert (launch.launcher, launch.rank, launch.size, launch.local_rank) == ("hydra", 2, 3, 1)
  assert launch.job_key == "hydra-size3" and not launch.job_key_is_unique
  assert mpi.from_environment({**hydra, "SLURM_JOB_ID": "812", "SLURM_STEP_ID": "4"}).job_key == "hydra-size3-812-4"
  assert mpi.from_environment({**hydra, "PBS_JOBID": "77.pbs/x"}).job_key == "hydra-size3-77.pbs_x"


def test_horovodrun_gloo_key_is_its_rendezvous_server():
  env = {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_CONTROLLER": "gloo",
         "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.5", "HOROVOD_GLOO_RENDEZVOUS_PORT": "41233"}
  launch = mpi.from_environment(env)
  assert (launch.launcher, launch.rank, launch.size, launch.local_rank) == ("horovod", 3, 4, 1)
  assert launch.job_key == "horovod-10.0.0.5-41233" and launch.job_key_is_unique


def test_srun_with_pmi2_is_slurm_not_hydra_and_no_launcher_is_none():
  assert mpi.detect({"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_STEP_NUM_TASKS": "2"}) is None  # no MPI_LOCALRANKID
  assert mpi.detect({}) is None
  assert mpi.detect(open_mpi(0, HOROVOD_RANK="0", HOROVOD_SIZE="2")) == "open_mpi"  # horovodrun over mpirun


def test_ranks_that_share_a_machine_and_all_its_gpus_are_warned_about():
  assert mpi.from_environment(open_mpi(0, OMPI_COMM_WORLD_LOCAL_SIZE="2")).local_size == 2
  assert mpi.from_environment({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}).local_size == 1
  assert mpi.shared_gpus_warning(4, 4).startswith("4 ranks run on this machine and each takes all its 4 GPUs")
  assert mpi.shared_gpus_warning(1, 8) is None  # one rank per machine
  assert mpi.shared_gpus_warning(4, 1) is None and mpi.shared_gpus_warning(2, 0) is None  # pinned, or no GPU


def test_a_rank_bound_to_one_core_of_several_is_warned_about():
  assert mpi.binding_warning(1, 2).startswith("the MPI launcher bound this rank to 1 of the machine's 2 cores")
  assert "mpirun --bind-to none" in mpi.binding_warning(1, 64)
  assert mpi.binding_warning(16, 64) is None and mpi.binding_warning(1, 1) is None  # a cgroup's share, one core


@pytest.mark.parametrize("env, message", [
    ({}, "cluster.source is mpi but no MPI launcher's variables are set (start the training with `mpirun -np N`"),
    (open_mpi(0, OMPI_COMM_WORLD_SIZE="two"), "OMPI_COMM_WORLD_SIZE is not a number: 'two'"),
    (open_mpi(2), "Open MPI mpirun environment is inconsistent: OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=2"),
])
def test_bad_launcher_environment_is_one_line(env, message):
  with pytest.raises(ConfigError) as caught:
    cluster.from_environment(env, source="mpi", workdir="/nonexistent")
  assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_one_rank_is_a_local_run_and_writes_nothing(tmp_path):
  assert cluster.from_environment(open_mpi(0, size=1), workdir=str(tmp_path)) == cluster.ClusterRole(
      alone="Open MPI mpirun started 1 rank")
  assert os.listdir(tmp_path) == []


def test_cluster_source_mpi_is_a_valid_setting():
  config = load_config("digits_cnn")
  config.cluster.source = "mpi"
  rules.check(config)
  config.cluster.source = "mpii"
  with pytest.raises(ConfigError, match=r"unknown cluster.source 'mpii' \(did you mean 'mpi'\?\); valid: auto, "
                                        r"tf_config, slurm, mpi, k8s, local"):
    rules.check(config)


def meet(environs, workdir, timeout=20.0):
  """cluster.from_environment for every fake environment at once (one thread each): {rank: Task or error}."""
  results = {}

  def one(rank, environ):
    try:
      results[rank] = cluster.from_environment(environ, workdir=workdir, startup_timeout_seconds=timeout)
    except Exception as e:  # pylint: disable=broad-except
      results[rank] = e

  threads = [threading.Thread(target=one, args=(r, e)) for r, e in enumerate(environs)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return results


def test_mpirun_in_an_sbatch_job_takes_the_ranks_and_every_rank_gets_every_address_in_rank_order(tmp_path):
  sbatch = {"SLURM_JOB_ID": "9", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}  # orted's step: 1 per node
  tasks = meet([open_mpi(rank, size=3, **sbatch) for rank in range(3)], str(tmp_path))
  assert all(isinstance(task, cluster.ClusterRole) for task in tasks.values()), tasks
  addresses = tasks[0].cluster["worker"]
  assert len(set(addresses)) == 3 and all(a.startswith(rendezvous.this_host() + ":") for a in addresses)
  for rank, task in tasks.items():
    assert (task.type, task.index, task.cluster) == ("worker", rank, {"worker": addresses})
    assert task.is_chief == (rank == 0) and task.num_workers == 3
    with open(task.rendezvous_file) as f:
      assert json.load(f) == {"rank": rank, "size": 3, "address": addresses[rank]}
  folder = os.path.join(tmp_path, ".cluster", "open_mpi-434372609-16bdeb9f-13c5feb7")
  assert sorted(os.listdir(folder)) == ["rank-0.json", "rank-1.json", "rank-2.json"]
  for task in tasks.values():
    rendezvous.forget(task.rendezvous_file)
  assert os.listdir(tmp_path / ".cluster") == []  # each rank's file, then the empty folder


def test_a_missing_rank_times_out_naming_it_and_an_earlier_launchs_files_are_not_read(tmp_path):
  earlier = meet([open_mpi(rank, size=3, jobid="1111") for rank in range(3)], str(tmp_path))
  assert all(isinstance(task, cluster.ClusterRole) for task in earlier.values())  # left behind: another job id
  tasks = meet([open_mpi(0, size=3, jobid="2222")], str(tmp_path), timeout=1.0)
  assert isinstance(tasks[0], WorkerLostError)
  assert str(tasks[0]).startswith("the MPI ranks did not meet within cluster.startup_timeout_seconds=1: no address "
                                  "from rank(s) 1, 2 in ")


def test_a_file_of_a_launch_of_another_size_under_the_same_key_is_refused(tmp_path):
  key = mpi.from_environment(open_mpi(0, size=2)).job_key
  rendezvous.publish(str(tmp_path), key, 1, 4, "elsewhere:1")
  with pytest.raises(ConfigError, match=r"rank-1.json belongs to a launch of 4 ranks, this one has 2: remove "):
    cluster.from_environment(open_mpi(0, size=2), workdir=str(tmp_path), startup_timeout_seconds=5)


def test_bounded_start_removes_the_rank_file_once_every_peer_answers(tmp_path):
  tasks = meet([open_mpi(rank, size=2) for rank in range(2)], str(tmp_path))
  peer_port = int(tasks[1].cluster["worker"][1].rpartition(":")[2])
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as peer:  # rank 1 is up
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    peer.bind(("", peer_port))
    peer.listen(8)
    with startup.bounded_start(tasks[0], timeout_seconds=20):
      assert not os.path.exists(tasks[0].rendezvous_file)  # removed before TensorFlow's start
  assert os.path.exists(tasks[1].rendezvous_file)  # rank 1's own: removed by rank 1


@pytest.mark.e2e
def test_a_rank_that_stops_before_the_start_removes_its_file_when_it_exits(tmp_path):
  script = ("import sys; from loops.distribute import rendezvous\n"
            "addresses, own = rendezvous.exchange(sys.argv[1], 'hydra-size1', 0, 1, 10)\n"
            "print(addresses, own, flush=True); sys.exit(1)  # as a config error after the exchange\n")
  result = subprocess.run([PY, "-c", script, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, timeout=120)
  assert result.returncode == 1 and str(tmp_path / ".cluster" / "hydra-size1" / "rank-0.json") in result.stdout
  assert os.listdir(tmp_path / ".cluster") == []


# ------------------------------------------------------------------ one real mpirun, against launch.local

MPIRUN = shutil.which("mpirun")
COMMON = ["main.py", "--config=configs/digits_cnn.py", "--config.strategy=multi_worker_mirrored",
          "--config.train.epochs=0", "--config.train.steps=60", "--config.train.steps_per_loop=20",
          "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0", "--config.export=False",
          "--config.deterministic=True"]  # both launches then compute bit for bit the same (measured)


def mpirun_env():
  env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",  # Open MPI as root
         "OMPI_MCA_rmaps_base_oversubscribe": "1",  # a CI machine with one core
         "OMPI_MCA_hwloc_base_binding_policy": "none"}  # as launch.local: not one core per rank (--bind-to none)
  env.pop("TF_CONFIG", None)
  return env


def train(command, workdir):
  env = mpirun_env()
  result = subprocess.run(command + [PY] + COMMON + [f"--workdir={workdir}"], cwd=REPO, env=env, timeout=400,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  assert result.returncode == 0, result.stdout[-3000:]
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f), result.stdout


@pytest.mark.e2e
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (Debian: apt-get install openmpi-bin)")
def test_mpirun_two_ranks_train_as_launch_local_two_workers(tmp_path):
  by_mpirun, log = train([MPIRUN, "-np", "2"], str(tmp_path / "mpirun"))
  by_launcher, _ = train([PY, "-m", "launch.local", "--workers=2", "--"], str(tmp_path / "local"))
  assert "bound this rank to 1" not in log
  assert re.search(r"(Open MPI mpirun|MPICH \(Hydra\) mpiexec) rank 1 of 2: cluster \[", log), log[-3000:]
  for summary in (by_mpirun, by_launcher):
    assert (summary["step"], summary["replicas"], summary["global_batch_size"]) == (60, 2, 64)
  for tag in ("eval/accuracy", "eval/loss", "train/loss", "train/accuracy"):
    assert by_mpirun[tag] == pytest.approx(by_launcher[tag], rel=1e-5), tag
  readers = [tf.train.load_checkpoint(str(tmp_path / d / "checkpoints")) for d in ("mpirun", "local")]
  keys = [k for k in readers[0].get_variable_to_shape_map() if "_trainable_variables" in k]
  assert len(keys) == 8
  for key in keys:  # the same weights: same global batch, same data order, same initial values
    np.testing.assert_allclose(readers[0].get_tensor(key), readers[1].get_tensor(key), rtol=1e-5, atol=1e-7,
                               err_msg=key)
  assert by_mpirun["eval/accuracy"] > 0.8  # it learned: 60 steps reach ~0.93
  assert os.listdir(tmp_path / "mpirun" / ".cluster") == []  # the ranks' address files are gone


@pytest.mark.e2e
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (Debian: apt-get install openmpi-bin)")
def test_the_lr_range_test_runs_under_mpirun_on_two_ranks(tmp_path):
  """The finders build their cluster as a run does (the ranks exchange addresses through the workdir)."""
  result = subprocess.run([MPIRUN, "-np", "2", PY, "main.py", "--config=configs/digits_cnn.py",
                           "--config.strategy=multi_worker_mirrored", f"--workdir={tmp_path}", "--find=lr",
                           "--config.find.lr_steps=40"], cwd=REPO, env=mpirun_env(), timeout=300, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  assert result.returncode == 0, result.stdout[-3000:]
  assert re.search(r"Open MPI mpirun rank 1 of 2: cluster \[", result.stdout), result.stdout[-3000:]
  with open(tmp_path / "lr_find" / "lr_find.json") as f:
    found = json.load(f)
  assert found["steps"] >= 10 and found["suggested_lr"] > 0
  assert result.stdout.count("--config.optimizer.learning_rate=") == 1  # printed by the chief alone
