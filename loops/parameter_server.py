"""ParameterServerStrategy: worker/ps tasks serve; the chief coordinates (ClusterCoordinator.schedule/join).

Limits: training is asynchronous (each worker applies its own steps to the shared variables), so runs are not
bit-reproducible and N workers do not compute what N synchronous replicas would; one step = one batch of
train.global_batch_size on one worker. Eval runs on the chief. The step counter is the framework's own
variable (Keras 3's optimizer.iterations under-counts under this strategy). Preemption handling does not
cover it (TensorFlow's PreemptionCheckpointHandler refuses a ps job).
"""

from absl import logging
import tensorflow as tf

from loops.errors import ConfigError


def check_cluster(task):
  jobs = {job: len(addresses) for job, addresses in task.cluster.items()}
  if not jobs.get("ps") or not jobs.get("worker") or jobs.get("chief") != 1:
    raise ConfigError(f"strategy 'parameter_server' needs a cluster with one chief, workers and ps tasks; TF_CONFIG "
                      f"has {jobs or 'no cluster'} (start it with `python -m launch.local --workers N --ps M -- ...`)")


def build_strategy(task):
  check_cluster(task)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(task.cluster), task_type="chief", task_id=0, rpc_layer="grpc")
  strategy = tf.distribute.ParameterServerStrategy(resolver)
  logging.info("strategy parameter_server: %d workers, %d ps", len(task.cluster["worker"]), len(task.cluster["ps"]))
  return strategy


def serve(task):
  """Runs this worker or ps task's server until the process is stopped (by the launcher or the cluster)."""
  check_cluster(task)
  server = tf.distribute.Server(tf.train.ClusterSpec(task.cluster), job_name=task.type, task_index=task.index,
                                protocol="grpc", start=True)
  logging.info("parameter_server: %s:%d serving at %s", task.type, task.index, task.cluster[task.type][task.index])
  server.join()


def make_loops(strategy, train_step_fn, step_counter, make_train_dataset, eval_step_fn, eval_dataset, train_metrics):
  """Returns (run_steps(n) -> last loss, run_eval()) for the coordinator.

  train_step_fn returns per-step sums (steps.make_train_step with metrics=None); they are fetched after each
  join and added to the coordinator's own train_metrics ({"loss": Mean, "accuracy": Mean}).
  """
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  iterator = iter(coordinator.create_per_worker_dataset(make_train_dataset))

  @tf.function
  def worker_step(per_worker_iterator):
    loss = strategy.run(train_step_fn, args=next(per_worker_iterator))
    step_counter.assign_add(1)
    return loss

  def run_steps(num_steps):
    remote = [coordinator.schedule(worker_step, args=(iterator,)) for _ in range(num_steps)]
    coordinator.join()
    results = [r.fetch() for r in remote]
    for result in results:
      train_metrics["loss"].update_state(result["loss_sum"] / result["count"], sample_weight=result["count"])
      train_metrics["accuracy"].update_state(result["correct"] / result["count"], sample_weight=result["count"])
    return tf.constant(results[-1]["loss"])

  @tf.function
  def run_eval():
    for images, labels, weights in eval_dataset:
      eval_step_fn(images, labels, weights)

  return run_steps, run_eval
