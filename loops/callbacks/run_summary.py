"""RunSummary: last of all, summary.json (chief) and the return value of train_and_evaluate."""

import posixpath
import time

from absl import logging

from loops.core import progress
from loops.core.interfaces import Callback


class RunSummary(Callback):
  """Last of all: summary.json (chief) and the return value of train_and_evaluate, in state.summary."""

  def __init__(self, plan, wall_started, unit="images"):
    self.plan, self.wall_started, self.unit = plan, wall_started, unit


  @classmethod
  def for_run(cls, run):
    return cls(run.parts.plan, run.wall_started, progress.throughput_unit(run.parts.source))

  def on_train_end(self, state):
    summary = {"step": state.step, "total_steps": state.total_steps, **state.train, **state.eval,
               "replicas": self.plan.replicas, "global_batch_size": self.plan.global_batch_size,
               "learning_rate": self.plan.learning_rate, "wall_seconds": time.perf_counter() - self.wall_started,
               **state.summary}
    if state.stop_reason:
      summary["stopped_early"] = state.stop_reason
    if state.step == state.start_step:
      summary = _kept_training_figures(summary, state.writer.read_json("summary.json"), state)
    elif state.start_step:
      summary = _resumed(summary, state.writer.read_json("summary.json"), state.start_step)
    state.summary.clear()
    state.summary.update(summary)
    state.writer.write_json("summary.json", summary)
    for line in short_summary(summary, trained=state.step != state.start_step, workdir=state.workdir,
                              unit=self.unit):
      state.writer.info("%s", line)
    logging.flush()


def short_summary(summary, trained, workdir, unit="images"):
  """What a person reads at the end (at most 4 lines of at most 120 characters; the full record is summary.json):
  the steps, times and throughput (`unit`/s: images, or examples of other features); why it stopped early; every
  eval metric; the best checkpoint; where the results are (left out after an early stop: the workdir is the one
  the user gave)."""
  lines = [_done_line(summary, trained, unit)]
  if summary.get("stopped_early"):
    lines.append(f"stopped early: {summary['stopped_early']}")
  lines.append(_fitted("eval: ", [f"{key.split('/', 1)[1]} {_number(value)}" for key, value in summary.items()
                                  if key.startswith("eval/")]))
  if summary.get("best_metric") and summary.get("best_value") is not None:
    lines.append(f"best: {summary['best_metric']} {_number(summary['best_value'])} at step {summary.get('best_step')}")
  saved = [name for name, present in ((f"checkpoints/{posixpath.basename(str(summary.get('checkpoint')))}",
                                       summary.get("checkpoint")), ("export/", summary.get("export"))) if present]
  lines.append(_fitted(f"in {workdir}: ", ["summary.json", *saved]))
  return [line[:MAX_WIDTH] for line in lines if line][:4]


MAX_WIDTH = 120


def _done_line(summary, trained, unit):
  line = f"done: step={summary['step']}/{summary['total_steps']}"
  if not trained:
    return line + " (trained before: evaluated again)"
  epoch = summary.get("mean_epoch_seconds_excluding_first")
  rate = summary.get("examples_per_sec")  # like the epoch times, of the calls after the first (tracing)
  after = ", ".join(([f"{rate:.0f} {unit}/s"] if rate else []) + ([f"{epoch:.2f} s per epoch"] if epoch else []))
  return (line + f" in {_duration(summary['wall_seconds'])} (training {_duration(summary.get('train_seconds', 0))}"
          + (f"; after the first call {after}" if after else "") + ")")


def _fitted(head, items):
  """head + items joined by ', ', as many as fit in MAX_WIDTH ('+N more in summary.json' for the rest)."""
  if not items:
    return ""
  for count in range(len(items), 0, -1):
    more = f" (+{len(items) - count} more in summary.json)" if count < len(items) else ""
    line = head + ", ".join(items[:count]) + more
    if len(line) <= MAX_WIDTH:
      return line
  return line


def _number(value):
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds):
  return f"{seconds:.1f} s" if seconds < 60 else progress.format_duration(seconds)


# What a start that trains no step (a rerun of a finished run) measures anew; the rest is the last start's.
REMEASURED = ("step", "total_steps", "checkpoint", "export", "sweep_settings")


def _resumed(summary, previous, start_step):
  """A resumed run's figures are its own (times, throughput: `resumed_from_step` says from where); what only the
  run's first start measured (the warm start's init/* counts) comes from the summary an earlier part wrote."""
  origin = {key: value for key, value in (previous or {}).items() if key.startswith("init/")}
  return {**origin, **summary, "resumed_from_step": start_step}


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
