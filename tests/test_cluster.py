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
