"""A study's config, loaded as main.py would (flag-free: benchmarks that define absl flags import it)."""

import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A study times training only: no evaluation until the end, no checkpoints, no export, no progress bar.
TRAINING_ONLY = ("--config.eval.every_steps=0", "--config.checkpoint.every_steps=0", "--config.export=False",
                 "--config.summary.progress_bar=off")
# The multi_worker case: each worker one intra-op and one inter-op thread, so 2 workers use the 2 cores.
ONE_THREAD = ("intra_op_threads", "inter_op_threads")


def load(config):
  """get_config(arg) of "configs/name.py[:arg]" (a path relative to the repository)."""
  path, _, arg = config.partition(":")
  spec = importlib.util.spec_from_file_location("study_config_module", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)
  spec.loader.exec_module(module)
  return module.get_config(arg or None)


def batch(loaded):
  """The config's global batch (a study's batch per replica or per worker)."""
  return loaded.train.global_batch_size or loaded.train.per_replica_batch_size
