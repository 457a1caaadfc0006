"""ParameterServerStrategy: worker/ps processes serve; the chief coordinates (ClusterCoordinator.schedule/join).

Limits: training is asynchronous (each worker applies its own steps to the shared variables), so runs are not
bit-reproducible and N workers do not compute what N synchronous replicas would; one step = one batch of
train.global_batch_size on one worker. Eval runs on the chief. The step counter is the framework's own
variable (Keras 3's optimizer.iterations under-counts under this strategy). Preemption handling does not
cover it (TensorFlow's PreemptionCheckpointHandler refuses a ps job).
"""

from absl import logging
import tensorflow as tf

from errors import ConfigError


def check_cluster(role):
  """The rule (called by loops/rules.py): one chief, at least one worker and one ps process."""
  jobs = {job: len(addresses) for job, addresses in role.cluster.items()}
  if not jobs.get("ps") or not jobs.get("worker") or jobs.get("chief") != 1:
    raise ConfigError(f"strategy 'parameter_server' needs a cluster with one chief, workers and ps; TF_CONFIG "
                      f"has {jobs or 'no cluster'} (start it with `python -m launch.local --workers N --ps M -- ...`)")


def build_strategy(role):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(role.cluster), task_type="chief", task_id=0, rpc_layer="grpc")
  strategy = tf.distribute.ParameterServerStrategy(resolver)
  logging.info("strategy parameter_server: %d workers, %d ps", len(role.cluster["worker"]), len(role.cluster["ps"]))
  return strategy


def serve(role):
  """Runs this worker or ps process's server until the process is stopped (by the launcher or the cluster)."""
  server = tf.distribute.Server(tf.train.ClusterSpec(role.cluster), job_name=role.type, task_index=role.index,
                                protocol="grpc", start=True)
  logging.info("parameter_server: %s:%d serving at %s", role.type, role.index, role.cluster[role.type][role.index])
  server.join()

