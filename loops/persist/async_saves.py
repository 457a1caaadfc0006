"""What asynchronous checkpoint saves need (checkpoint.async_save): the strategies they are used with, a write-callback
list that keeps the "saved checkpoint" line after the index update, and the Keras 3 fix for TensorFlow's writer.
Checkpoints (checkpoints.py) does the saving."""

from absl import logging

from loops import private_apis

# Strategies under which checkpoint.async_save takes effect (verified in tests/test_async_save.py and by hand with
# 2-worker MWMS); elsewhere saves stay blocking: see docs/reliability.md "Asynchronous saves".
ASYNC_STRATEGIES = ("one_device", "mirrored", "multi_worker_mirrored")


def async_save_enabled(async_save, strategy):
  """Whether this run's periodic saves are asynchronous: checkpoint.async_save and a strategy (its name) it is used
  with."""
  if not async_save:
    return False
  if strategy not in ASYNC_STRATEGIES:
    logging.info("checkpoint.async_save: not used with strategy=%s (blocking saves; used with %s)", strategy,
                 ", ".join(ASYNC_STRATEGIES))
    return False
  return True


class LastStaysLast(list):
  """A write-callback list whose last callback stays last: CheckpointManager.save appends its index update,
  which goes before it. (TensorFlow copies the options, and their list with `copy.copy`.)"""

  def append(self, item):
    self.insert(max(len(self) - 1, 0), item)

  def __copy__(self):
    return type(self)(self)


def keras_variables_reuse_their_host_copy():
  """Makes Keras 3 variables usable with TensorFlow's asynchronous checkpointing (idempotent; process-wide).

  The Keras variable is saved as the tf.Variable it wraps (same tensors, same names), so it maps to that variable's
  host copy, made once and updated each save (loops/private_apis.py says why Keras' own copy fails)."""
  private_apis.keras_variables_reuse_their_host_copy()
