"""RunSummary: last of all, summary.json (chief) and the return value of train_and_evaluate."""

import time

from absl import logging

from loops.core.interfaces import Callback
from loops.persist.writers import format_values


class RunSummary(Callback):
  """Last of all: summary.json (chief) and the return value of train_and_evaluate, in state.summary."""

  def __init__(self, plan, wall_started):
    self.plan, self.wall_started = plan, wall_started

  def on_train_end(self, state):
    summary = {"step": state.step, "total_steps": state.total_steps, **state.train, **state.eval,
               "replicas": self.plan.replicas, "global_batch_size": self.plan.global_batch_size,
               "learning_rate": self.plan.learning_rate, "wall_seconds": time.perf_counter() - self.wall_started,
               **state.summary}
    if state.stop_reason:
      summary["stopped_early"] = state.stop_reason
    if state.step == state.start_step:
      summary = _kept_training_figures(summary, state.writer.read_json("summary.json"), state)
    state.summary.clear()
    state.summary.update(summary)
    state.writer.write_json("summary.json", summary)
    state.writer.info("done: %s", format_values(summary))
    if state.step != state.start_step:
      epoch_time = summary.get("mean_epoch_seconds_excluding_first")
      state.writer.info("throughput: %.0f images/s over %d steps (%d replica(s)), %s per epoch excluding the first",
                        summary["examples_per_sec"], state.step - state.start_step, self.plan.replicas,
                        f"{epoch_time:.2f} s" if epoch_time else "n/a (fewer than 2 whole epochs)")
    logging.flush()


# What a start that trains no step (a rerun of a finished run) measures anew; the rest is the last start's.
REMEASURED = ("step", "total_steps", "checkpoint", "export", "sweep_settings")


def _kept_training_figures(summary, previous, state):
  """A rerun of a finished run evaluates again and trains nothing: summary.json keeps the training figures it had
  (train/*, throughput, times) and takes the new eval results."""
  if not previous:
    return summary
  state.writer.info("the run was complete at step %d: evaluated again; summary.json keeps its training figures",
                    state.step)
  fresh = {key: value for key, value in summary.items()
           if key in REMEASURED or key.startswith(("eval/", "best_"))}
  return {**previous, **fresh}
