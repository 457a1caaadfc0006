"""Task.update_every (loops/task/update_every.py): a model updated every k steps, one traced variant of the step per
combination, picked per step outside the replicas. The WGAN-GP example passes the replica check (whose default
steps reach the generator's update), the generator changes only on steps k-1 and 2k-1 on 2 replicas, a loss-level
task skips the other steps' gradients, an optimizer applied inside control flow of the step is refused in one line
before step 1 on one replica too, and update_every itself is checked."""

import numpy as np
import pytest

from configs import settings
from errors import ConfigError
from loops import build as build_lib
from loops import rules as rules_lib
from loops import replica_check
from loops import run
from loops.distribute import cluster
from loops.distribute import execution as execution_lib
from loops.distribute import strategy as strategy_lib
from loops.task import rules as task_rules
from tests.conftest import load_config, run_main, set_keys

FIXTURES = "tests.fixtures.update_every_tasks:"
K = 5  # the example's n_critic


def wgan_gp(**overrides):
  config = load_config("tasks", "wgan_gp")
  return set_keys(config, {"export": False, "checkpoint.best_metric": "", **overrides})


def steps_changing(config, steps):
  """({model name: [steps whose update changed its weights]} over `steps` calls of one step each, the run's parts)."""
  rules_lib.check(config)
  strategy_lib.configure_devices(settings.read(config).run)
  parts = build_lib.build(config, cluster.ClusterRole())
  read = settings.read(config)
  execution = execution_lib.make(parts, read.run, read.preemption)
  weights = lambda model: np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
  before = {name: weights(model) for name, model in parts.models.items()}
  changed = {name: [] for name in parts.models}
  for step in range(steps):
    execution.train(1)
    for name, model in parts.models.items():
      after = weights(model)
      if not np.array_equal(after, before[name]):
        changed[name].append(step)
      before[name] = after
  return changed, parts


@pytest.mark.e2e
def test_the_wgan_gp_example_trains_and_its_check_reaches_the_generator_step(tmp_path):
  summary = run.train_and_evaluate(wgan_gp(), str(tmp_path))
  assert summary["eval/mean_gap"] <= 0.08 and summary["eval/wasserstein"] > 0, summary  # docstring: ≈ 0.04
  config = load_config("tasks", "wgan_gp")
  assert replica_check.steps_for(config) == K  # lcm of the periods: step 4 updates the generator
  # its replica check (those K steps) is a row of tests/test_replica_matrix.py


def test_the_generator_changes_only_on_steps_k_minus_1_and_2k_minus_1_on_two_replicas():
  changed, parts = steps_changing(wgan_gp(strategy="mirrored", cpu_replicas=2), 2 * K)
  assert changed == {"model": [K - 1, 2 * K - 1], "critic": list(range(2 * K))}
  iterations = {name: int(o.iterations.numpy()) for name, o in parts.optimizers.items()}
  assert iterations == {"model": 2, "critic": 2 * K}  # each optimizer counts its own updates (and its schedule)


def test_a_loss_level_task_skips_the_update_of_a_model_on_its_off_steps():
  config = set_keys(load_config("tasks", "regression"), {
      "task.name": FIXTURES + "OffsetEverySecondStep", "data.name": "digits", "checkpoint.best_metric": "",
      "strategy": "mirrored", "cpu_replicas": 2, "data.device_resident": "on"})
  changed, _ = steps_changing(config, 4)
  assert changed == {"model": [0, 1, 2, 3], "offset": [1, 3]}


@pytest.mark.parametrize("task, message", [
    ("RawCond", r"^RawCond.train_step applies optimizer 'model' inside control flow \(tf.cond/if on a tensor/while\): "
                r"on several replicas this cannot compile; declare update_every = \{'model': k\} and branch on "
                r"ctx.updates\('model'\) \(see docs/tasks.md"),
    ("IgnoresUpdateEvery", r"^IgnoresUpdateEvery.train_step applies optimizer 'model' on a step where update_every "
                           r"skips it: apply it only under `if ctx.updates\('model'\):`"),
])
def test_an_optimizer_applied_in_control_flow_or_on_a_skipped_step_is_refused_before_step_one(task, message,
                                                                                               tmp_path):
  config = wgan_gp(**{"task.name": FIXTURES + task, "strategy": "one_device"})
  with pytest.raises(ConfigError, match=message):
    run.train_and_evaluate(config, str(tmp_path))
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.e2e
def test_check_replicas_ends_with_the_one_line_not_a_traceback():
  result = run_main("--config=configs/tasks.py:wgan_gp", "--check=replicas", f"--config.task.name={FIXTURES}RawCond")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      "error: RawCond.train_step applies optimizer 'model' inside control flow"), result.stderr[-3000:]


class Stepper:
  """A task as check_optimizers sees it."""
  writes_step = True

  def __init__(self, update_every):
    self.update_every = update_every


@pytest.mark.parametrize("update_every, message", [
    ({"generator": 5}, r"^Stepper.update_every names 'generator', which is not a trained model of the task \(models "
                       r"with an optimizer: \['critic', 'model'\]\)"),
    ({"teacher": 2}, r"names 'teacher', which is not a trained model"),  # a model without an optimizer
    ({"model": 0}, r"^Stepper.update_every\['model'\] must be an integer >= 1 .*, got 0$"),
    ({"model": 2.5}, r"must be an integer >= 1 .*, got 2.5$"),
    ({"model": 2, "critic": 2, "a": 2, "b": 2}, r"lists 4 models \(\['a', 'b', 'critic', 'model'\]\); at most 3"),
    ([("model", 5)], r"^Stepper.update_every must be a dict \{model name: k\}"),
])
def test_update_every_names_trained_models_with_whole_periods(update_every, message):
  import keras
  dense = lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  models = {"model": dense(), "critic": dense(), "teacher": dense()}
  optimizers = {"model": keras.optimizers.SGD(), "critic": keras.optimizers.SGD()}
  with pytest.raises(ConfigError, match=message):
    task_rules.check_optimizers(Stepper(update_every), models, optimizers)


def test_a_bad_update_every_is_refused_with_the_settings_before_anything_is_built():
  config = wgan_gp(**{"task.name": FIXTURES + "ZeroPeriod"})
  with pytest.raises(ConfigError, match=r"^ZeroPeriod.update_every\['model'\] must be an integer >= 1"):
    rules_lib.check(config)
