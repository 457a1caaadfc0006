import json
import os
import re

import pytest

from errors import ConfigError
from loops.distribute import cluster


def tf_config(cluster_spec, task_type, index):
  return {"TF_CONFIG": json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})}


def test_no_tf_config_is_a_local_chief():
  task = cluster.from_environment({})
  assert task.type == "local" and task.is_chief and task.num_workers == 1


@pytest.mark.parametrize("spec, task_type, index, chief", [
    ({"worker": ["a:1", "b:2"]}, "worker", 0, True),
    ({"worker": ["a:1", "b:2"]}, "worker", 1, False),
    ({"chief": ["c:0"], "worker": ["a:1"]}, "worker", 0, False),
    ({"chief": ["c:0"], "worker": ["a:1"]}, "chief", 0, True),
])
def test_chief_is_the_chief_task_or_worker_0(spec, task_type, index, chief):
  assert cluster.from_environment(tf_config(spec, task_type, index)).is_chief is chief


@pytest.mark.parametrize("task_type, index, chief, rank", [("master", 0, True, 0), ("worker", 0, False, 1),
                                                           ("worker", 1, False, 2)])
def test_a_master_job_is_the_chief(task_type, index, chief, rank):
  """SageMaker's and legacy cloud training's TF_CONFIG name the chief 'master'; every process renames it alike."""
  spec = {"master": ["m:0"], "worker": ["a:1", "b:2"]}
  task = cluster.from_environment(tf_config(spec, task_type, index))
  assert task.type == ("chief" if task_type == "master" else "worker") and task.is_chief is chief
  assert task.cluster == {"chief": ["m:0"], "worker": ["a:1", "b:2"]} and task.num_workers == 3
  assert task.worker_index == rank


@pytest.mark.parametrize("raw, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG has no 'cluster'"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "TF_CONFIG has no 'task'"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}),
     "task.type 'ps' is not a job of the cluster; jobs: worker"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}),
     "task.index 3 is out of range: job 'worker' has 1 address"),
])
def test_malformed_tf_config_names_the_field(raw, message):
  with pytest.raises(ConfigError, match=message):
    cluster.from_environment({"TF_CONFIG": raw})


def slurm_env(procid, nodelist="n[1-2]", tasks_per_node="2(x2)", num_tasks=4, job_id="4242"):
  return {"SLURM_PROCID": str(procid), "SLURM_STEP_NUM_TASKS": str(num_tasks), "SLURM_JOB_ID": job_id,
          "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node}


# What Slurm 22.05 gives `sbatch --ntasks=2` on one node (printed by `env | grep SLURM` in a real job): the batch
# shell has the job's variables only; each task of `srun` inside it has the step's as well.
BATCH_SHELL = {"SLURM_JOB_ID": "17", "SLURM_JOBID": "17", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_PROCID": "0",
               "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "vm", "SLURM_NODELIST": "vm",
               "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_GTIDS": "0"}
SRUN_TASK_1 = {**BATCH_SHELL, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_GTIDS": "0,1", "SLURM_STEPID": "0",
               "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1",
               "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_TASKS_PER_NODE": "2"}


@pytest.mark.parametrize("procid", range(4))
def test_slurm_two_nodes_times_two_tasks_without_gpus(procid):
  task = cluster.from_environment(slurm_env(procid), slurm_port_base=9000)
  assert task.cluster == {"worker": ["n1:9000", "n1:9001", "n2:9000", "n2:9001"]}
  assert (task.type, task.index, task.is_chief, task.num_workers) == ("worker", procid, procid == 0, 4)


def test_tf_config_wins_over_slurm_in_auto_mode():
  env = {**slurm_env(1), **tf_config({"worker": ["a:1", "b:2"]}, "worker", 0)}
  assert cluster.from_environment(env).cluster == {"worker": ["a:1", "b:2"]}
  assert cluster.from_environment(env, source="slurm").index == 1


def test_single_srun_task_is_local_and_bad_slurm_env_is_explained():
  assert cluster.from_environment(slurm_env(0, "n1", "1", 1)).type == "local"
  with pytest.raises(ConfigError, match="SLURM environment is inconsistent: 4 tasks, 3 task slots"):
    cluster.from_environment(slurm_env(0, "n[1-2]", "2,1", 4))
  with pytest.raises(ConfigError, match="SLURM_PROCID is not set"):
    cluster.from_environment({}, source="slurm")


def test_auto_trains_locally_in_a_batch_shell_and_joins_the_cluster_in_an_srun_task():
  """`sbatch --ntasks=2 --wrap "python main.py ..."` is one process: SLURM_NTASKS=2 alone is no cluster."""
  assert cluster.from_environment(BATCH_SHELL) == cluster.ClusterRole()
  task = cluster.from_environment(SRUN_TASK_1)
  assert (task.type, task.index, task.num_workers, task.is_chief) == ("worker", 1, 2, False)
  base = 20000 + 17 * 64
  assert task.cluster == {"worker": [f"vm:{base}", f"vm:{base + 1}"]}
  with pytest.raises(ConfigError, match="cluster.source is slurm but SLURM_STEP_NUM_TASKS is not set .start the "
                                        "training with srun"):
    cluster.from_environment(BATCH_SHELL, source="slurm")


def test_derived_slurm_ports_differ_between_jobs_and_stay_below_the_ephemeral_range():
  bases = [cluster.slurm_port_base({"SLURM_JOB_ID": str(job)}) for job in range(1_000_000, 1_000_199)]
  assert len(set(bases)) == 199  # 199 consecutive jobs (or array tasks) on one node: 199 disjoint blocks of 64
  assert all(b % 64 == 20000 % 64 for b in bases) and min(bases) >= 20000 and max(bases) + 63 <= 32767
  assert cluster.slurm_port_base({"SLURM_JOB_ID": "1000199"}) == bases[0]  # the 200th reuses the first block
  assert cluster.slurm_port_base({"SLURM_JOB_ID": "5"}, explicit=9000) == 9000
  two_jobs = [cluster.from_environment(slurm_env(0, "vm", "2", 2, job)).cluster["worker"] for job in ("41", "42")]
  assert not set(two_jobs[0]) & set(two_jobs[1])
  assert cluster.from_environment(slurm_env(0, "vm", "2", 2, "41"), slurm_port_base=9000).cluster == {
      "worker": ["vm:9000", "vm:9001"]}


@pytest.mark.parametrize("env, port_base, message", [
    ({**slurm_env(0, "vm", "2", 2), "SLURM_JOB_ID": ""}, None,
     "cannot derive SLURM ports: SLURM_JOB_ID is '', not a job number; set cluster.slurm_port_base"),
    (slurm_env(0, "vm", "65", 65), None, "65 tasks on a node need more than the 64 ports derived from SLURM_JOB_ID"),
    (slurm_env(0, "vm", "2", 2), 65535, "cluster.slurm_port_base 65535 gives ports 65535..65536; they must lie in"),
    (slurm_env(0, "vm", "2", 2), 0, "cluster.slurm_port_base 0 gives ports 0..1"),
    ({**SRUN_TASK_1, "SLURM_STEP_NUM_TASKS": "two"}, None, "SLURM_STEP_NUM_TASKS is not a number: 'two'"),
])
def test_slurm_ports_that_cannot_work_are_one_line(env, port_base, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    cluster.from_environment(env, slurm_port_base=port_base)


# TF_CONFIG exactly as cluster managers write it (sources in each docstring).

def _env(tf_config, **extra):
  return {"TF_CONFIG": tf_config if isinstance(tf_config, str) else json.dumps(tf_config), **extra}


TFJOB_TRAINING = {"chief": ["mnist-chief-0.team.svc:2222"], "ps": ["mnist-ps-0.team.svc:2222"],
                  "worker": ["mnist-worker-0.team.svc:2222", "mnist-worker-1.team.svc:2222"]}
TFJOB_EVALUATOR = {"evaluator": ["mnist-evaluator-0.team.svc:2222"]}


@pytest.mark.parametrize("lists_evaluator", [True, False], ids=["operator_v1", "operator_v1alpha2"])
@pytest.mark.parametrize("task_type, index, chief", [("chief", 0, True), ("worker", 0, False), ("worker", 1, False),
                                                     ("ps", 0, False), ("evaluator", 0, False)])
def test_kubeflow_tfjob(lists_evaluator, task_type, index, chief):
  """training-operator genTFConfigJSONStr: {"cluster","task","environment":"cloud"}, Go's sorted map keys,
  `<job>-<type>-<i>.<namespace>.svc:<tfjob-port>`; kubeflow.org/v1 lists the evaluator in "cluster" (pod_test.go
  TestClusterSpec), v1alpha2 left it out (kubeflow/trainer#650). Training tasks never see it either way."""
  spec = {**TFJOB_EVALUATOR, **TFJOB_TRAINING} if lists_evaluator else TFJOB_TRAINING
  raw = json.dumps({"cluster": spec, "task": {"type": task_type, "index": index}, "environment": "cloud"},
                   separators=(",", ":"))
  task = cluster.from_environment(_env(raw))
  assert (task.type, task.index, task.is_chief, task.is_evaluator) == (task_type, index, chief,
                                                                       task_type == "evaluator")
  assert task.cluster == TFJOB_TRAINING and task.num_workers == 3
  assert task.is_distributed is (task_type != "evaluator")


VERTEX_TRAINING = {"chief": ["workerpool0-7f3a-0:2222"], "worker": ["workerpool1-7f3a-0:2222",
                                                                    "workerpool1-7f3a-1:2222"]}
VERTEX_POOLS = {"workerpool0": ["workerpool0-7f3a-0:2222"],
                "workerpool1": ["workerpool1-7f3a-0:2222", "workerpool1-7f3a-1:2222"],
                "workerpool3": ["workerpool3-7f3a-0:2222"]}


@pytest.mark.parametrize("task_type, index, pool, chief", [("chief", 0, "workerpool0", True),
                                                           ("worker", 1, "workerpool1", False),
                                                           ("evaluator", 0, "workerpool3", False)])
def test_vertex_ai_with_its_cluster_spec(task_type, index, pool, chief):
  """Vertex AI / AI Platform: workerPoolSpecs[0..3] = chief, workers, ps, evaluator; TF_CONFIG adds "job",
  "environment": "cloud", task "trial" and "cloud", and never lists the evaluator (AI Platform's "TF_CONFIG and
  distributed training" page); custom containers also get CLUSTER_SPEC with workerpoolN job names."""
  tf_config = {"cluster": VERTEX_TRAINING, "environment": "cloud",
               "job": {"python_module": "main", "args": ["--config=configs/digits_cnn.py"]},
               "task": {"cloud": "q2ab5e1-ml", "index": index, "trial": "", "type": task_type}}
  cluster_spec = {"cluster": VERTEX_POOLS, "environment": "cloud", "task": {"type": pool, "index": index, "trial": ""},
                  "job": {}}
  alone = cluster.from_environment(_env(tf_config))
  assert alone == cluster.from_environment(_env(tf_config, CLUSTER_SPEC=json.dumps(cluster_spec)))
  assert (alone.type, alone.index, alone.is_chief, alone.is_evaluator) == (task_type, index, chief,
                                                                           task_type == "evaluator")
  assert alone.cluster == VERTEX_TRAINING


@pytest.mark.parametrize("task_type, index, parsed_type", [("master", 0, "chief"), ("worker", 0, "worker"),
                                                           ("ps", 1, "ps")])
def test_sagemaker_parameter_server(task_type, index, parsed_type):
  """sagemaker-tensorflow-training-toolkit _build_tf_config: hosts[0] is "master" (port 2222), every host runs a
  ps on 2223, the others are workers; "environment": "cloud"."""
  raw = json.dumps({"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                                "worker": ["algo-2:2222"]}, "environment": "cloud",
                    "task": {"index": index, "type": task_type}})
  task = cluster.from_environment(_env(raw))
  assert (task.type, task.index, task.is_chief) == (parsed_type, index, task_type == "master")
  assert task.cluster == {"chief": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"], "worker": ["algo-2:2222"]}


@pytest.mark.parametrize("index", range(3))
def test_ray_train_worker_only(index):
  """Ray Train TensorflowTrainer (_setup_tensorflow_environment): a worker-only cluster, worker 0 is the chief."""
  workers = ["10.0.0.5:36417", "10.0.0.6:40121", "10.0.0.7:33859"]
  task = cluster.from_environment(_env({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
  assert (task.type, task.is_chief, task.worker_index, task.num_workers) == ("worker", index == 0, index, 3)


@pytest.mark.parametrize("spec, task, message", [
    ({"worker": ["a:1"], "workerpool0": ["b:2"]}, {"type": "worker"},
     "cluster job 'workerpool0' is not one TensorFlow knows; valid: master, chief, worker, ps, evaluator"),
    ({"master": ["m:1"], "chief": ["c:2"]}, {"type": "chief"}, "both a 'master' and a 'chief' job"),
    ({"chief": ["c:1", "d:2"]}, {"type": "chief"}, "cluster job 'chief' has 2 addresses; a cluster has one chief"),
    ({"worker": "a:1"}, {"type": "worker"}, "cluster job 'worker' must be a list of \"host:port\" strings"),
    ({"evaluator": ["e:1"]}, {"type": "evaluator"}, "no training job \\(chief, worker or ps\\), only an evaluator"),
    ({"worker": ["a:1"], "evaluator": ["e:1"]}, {"type": "evaluator", "index": 1},
     "task.index 1 is out of range: job 'evaluator' has 1 address"),
    ({"worker": ["a:1"]}, {"type": "evaluator", "index": -1}, "task.index -1 is out of range"),
    ({"worker": ["a:1"]}, {"type": "worker", "index": True}, "task.index True is out of range"),
])
def test_what_tensorflow_would_refuse_is_one_line(spec, task, message):
  with pytest.raises(ConfigError, match=message):
    cluster.from_environment(_env({"cluster": spec, "task": task}))


def test_an_empty_job_is_dropped():
  """A TFJob replica type scaled to 0 is written as an empty list."""
  task = cluster.from_environment(_env({"cluster": {"worker": ["a:1"], "ps": []}, "task": {"type": "worker"}}))
  assert task.cluster == {"worker": ["a:1"]}


# The strategies build their resolver from the parsed Task, never from os.environ["TF_CONFIG"].

class _Captured(Exception):
  pass


def _capture(monkeypatch, name):
  import tensorflow as tf

  def fake(*args, cluster_resolver=None, **kwargs):
    resolver = cluster_resolver or args[0]
    raise _Captured(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id, resolver.rpc_layer)
  fake._collective_key_base = 0  # as the strategy class it stands in for (loops/private_apis.py sets it)
  monkeypatch.setattr(tf.distribute, name, fake)


def _config(strategy):
  from tests.conftest import load_config
  c = load_config("digits_cnn")
  c.strategy = strategy
  return c


def _sections(config):
  """(the run settings, the cluster settings): what strategy.build takes."""
  from configs import settings
  read = settings.read(config)
  return read.run, read.cluster


WITH_MASTER_AND_EVALUATOR = {"cluster": {"master": ["m:2222"], "worker": ["w:2222"], "ps": ["p:2223"],
                                         "evaluator": ["e:2222"]}, "environment": "cloud"}


@pytest.mark.parametrize("strategy_name, tf_name, task_type, index, jobs", [
    ("multi_worker_mirrored", "MultiWorkerMirroredStrategy", "master", 0, ("master", "worker", "evaluator")),
    ("multi_worker_mirrored", "MultiWorkerMirroredStrategy", "worker", 0, ("master", "worker", "evaluator")),
    ("parameter_server", "ParameterServerStrategy", "master", 0, ("master", "worker", "ps", "evaluator")),
])
def test_strategies_get_the_parsed_cluster(monkeypatch, strategy_name, tf_name, task_type, index, jobs):
  """A TF_CONFIG with "master" and an evaluator job (TFConfigClusterResolver would hand TensorFlow both: it refuses
  "master", and ParameterServerStrategy waits on every listed task) reaches the strategy as chief + workers
  (+ ps), over grpc."""
  from loops.distribute import strategy
  spec = {job: WITH_MASTER_AND_EVALUATOR["cluster"][job] for job in jobs}
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": {"type": task_type, "index": index},
                                              "environment": "cloud"}))
  _capture(monkeypatch, tf_name)
  with pytest.raises(_Captured) as got:
    strategy.build(*_sections(_config(strategy_name)), cluster.from_environment())
  passed, resolver_type, resolver_index, rpc = got.value.args
  assert passed == {("chief" if job == "master" else job): spec[job] for job in jobs if job != "evaluator"}
  assert (resolver_type, resolver_index, rpc) == ("chief" if task_type == "master" else task_type, index, "grpc")


@pytest.mark.parametrize("strategy_name", ["multi_worker_mirrored", "parameter_server"])
def test_an_evaluator_evaluates_on_its_own_devices(monkeypatch, strategy_name):
  import tensorflow as tf
  from loops.distribute import strategy
  for name in ("MultiWorkerMirroredStrategy", "ParameterServerStrategy"):
    _capture(monkeypatch, name)  # joining the training cluster would raise _Captured
  task = cluster.from_environment(_env({**WITH_MASTER_AND_EVALUATOR, "task": {"type": "evaluator", "index": 0}}))
  built = strategy.build(*_sections(_config(strategy_name)), task)
  assert isinstance(built, tf.distribute.OneDeviceStrategy) and built.num_replicas_in_sync == 1


MWMS_FROM_ENVIRONMENT = """
import json, os, sys
from configs import base
from configs import settings
from loops.distribute import cluster
from loops.distribute import strategy
c = base.get_config()
c.strategy = "multi_worker_mirrored"
read = settings.read(c)
s = strategy.build(read.run, read.cluster, cluster.from_environment())
r = s.cluster_resolver
print(json.dumps([r.cluster_spec().as_dict(), r.task_type, r.task_id, s.extended._is_chief, s.num_replicas_in_sync]))
"""


@pytest.mark.e2e
def test_mwms_starts_from_a_master_tf_config_with_an_evaluator():
  """A real MultiWorkerMirroredStrategy (1 task on a loopback port) from SageMaker's "master" naming, with a TFJob
  evaluator job and "environment": "cloud" in the same TF_CONFIG."""
  import socket
  import subprocess
  import sys
  from tests.conftest import REPO
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  tf_config = {"cluster": {"master": [f"127.0.0.1:{port}"], "evaluator": ["127.0.0.1:1"]},
               "task": {"type": "master", "index": 0}, "environment": "cloud"}
  env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
  done = subprocess.run([sys.executable, "-c", MWMS_FROM_ENVIRONMENT], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=60)
  assert done.returncode == 0, done.stderr[-2000:]
  spec, task_type, task_id, is_chief, replicas = json.loads(done.stdout.strip().splitlines()[-1])
  assert spec == {"chief": [f"127.0.0.1:{port}"]} and (task_type, task_id, is_chief, replicas) == ("chief", 0, True, 1)


@pytest.mark.e2e
def test_a_dry_run_of_one_worker_says_it_waits_for_its_peers_and_ends_naming_the_missing_one(tmp_path):
  """A pod's --dry_run waited silently up to the startup timeout: it says why it waits and for whom."""
  import sys
  from tests.conftest import run_command
  from tests.test_monitoring import free_port

  workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
  environment = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                        "task": {"type": "worker", "index": 1}})}
  done = run_command([sys.executable, "main.py", "--config=configs/digits_cnn.py",
                      "--config.strategy=multi_worker_mirrored", "--config.cluster.startup_timeout_seconds=3",
                      "--dry_run", f"--workdir={tmp_path}/w"], env=environment, merge_output=True)
  lines = done.stdout.strip().splitlines()
  assert done.returncode != 0 and lines[-1] == (
      f"error: the cluster did not start within cluster.startup_timeout_seconds=3: nothing listens for worker 0 "
      f"({workers[0]}): did it start? (see its log)"), done.stdout[-3000:]
  assert any(line.endswith(f"] dry run of worker 1 of 2: the multi-worker strategy starts only with every peer "
                           f"({workers[0]}, {workers[1]}), so this waits for them (at most "
                           f"cluster.startup_timeout_seconds=3 s); start the others too, or dry-run one machine's "
                           f"share with --config.cluster.source=local --config.strategy=mirrored") for line in lines)
