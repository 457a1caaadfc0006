"""Who am I? The task of this process from TF_CONFIG: type, index, chief or not."""

import dataclasses
import json
import os

from loops.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Task:
  type: str = "local"  # local (no cluster), chief, worker, ps, evaluator
  index: int = 0
  cluster: dict = dataclasses.field(default_factory=dict)

  @property
  def is_chief(self):
    """The chief writes summaries, config.json and the real checkpoint series; the others only take part."""
    if self.type in ("local", "chief"):
      return True
    return self.type == "worker" and self.index == 0 and "chief" not in self.cluster

  @property
  def num_workers(self):
    return len(self.cluster.get("worker", [])) + len(self.cluster.get("chief", [])) or 1


def from_environment(environ=None):
  """Parses TF_CONFIG (if set) into a Task; a malformed TF_CONFIG raises ConfigError naming the field."""
  environ = os.environ if environ is None else environ
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
  if not isinstance(task, dict) or "type" not in task:
    raise ConfigError("TF_CONFIG has no 'task' with a 'type' (e.g. {\"type\": \"worker\", \"index\": 0})")
  task_type, index = task["type"], task.get("index", 0)
  if task_type not in cluster:
    raise ConfigError(f"TF_CONFIG task.type '{task_type}' is not a job of the cluster; jobs: {', '.join(cluster)}")
  if not isinstance(index, int) or not 0 <= index < len(cluster[task_type]):
    raise ConfigError(f"TF_CONFIG task.index {index!r} is out of range: job '{task_type}' has "
                      f"{len(cluster[task_type])} task(s)")
  return Task(type=task_type, index=index, cluster=cluster)
