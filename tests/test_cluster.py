import json

import pytest

from loops import cluster
from loops.errors import ConfigError


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
  """SageMaker's and legacy cloud training's TF_CONFIG name the chief 'master'; every task renames it alike."""
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
     "task.index 3 is out of range: job 'worker' has 1 task"),
])
def test_malformed_tf_config_names_the_field(raw, message):
  with pytest.raises(ConfigError, match=message):
    cluster.from_environment({"TF_CONFIG": raw})


def slurm_env(procid, nodelist="n[1-2]", tasks_per_node="2(x2)", num_tasks=4):
  return {"SLURM_PROCID": str(procid), "SLURM_STEP_NUM_TASKS": str(num_tasks),
          "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node}


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
