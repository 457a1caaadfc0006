"""WorkerMonitor: memory after each train call (a train call's peak too: memory/step_peak_mb); under multi-worker training, the straggler warning and each
worker's mean busy time per call in summary.json (the per-call scalars come with the call's train results)."""

from loops.core import stragglers
from loops.distribute import memory
from loops.core.interfaces import Callback


class WorkerMonitor(Callback):
  """Args: straggler_fraction, straggler_calls (summary.*); memory_usage() -> {memory/...: MB} of this process."""

  def __init__(self, straggler_fraction, straggler_calls, memory_usage):
    self.watch = stragglers.StragglerWatch(straggler_fraction, straggler_calls)
    self.memory_usage, self.peaks, self.busy_totals, self.calls = memory_usage, {}, None, 0


  READS = ("summary",)

  @classmethod
  def for_run(cls, run, summary):
    step_memory = getattr(run.execution, "step_memory", None)  # a train call's peak (SyncExecution)
    usage = (lambda: {**memory.usage_mb(), **step_memory.values()}) if step_memory else memory.usage_mb
    return cls(summary.straggler_fraction, summary.straggler_calls, usage)

  def after_train_call(self, state):
    memory = self.memory_usage()
    for tag, value in memory.items():
      self.peaks[tag] = max(value, self.peaks.get(tag, 0.0))
    state.writer.scalars(state.step, memory)
    if state.worker_seconds:
      self.calls += 1
      self.busy_totals = [a + b for a, b in zip(self.busy_totals or [0.0] * len(state.worker_seconds),
                                                state.worker_seconds)]
      warning = self.watch.observe(state.worker_seconds)
      if warning:
        state.writer.warning("%s", warning)

  def on_train_end(self, state):
    if self.peaks:
      state.summary["memory_mb"] = {tag.split("/", 1)[1]: round(value, 1) for tag, value in self.peaks.items()}
    if self.calls:
      state.summary["worker_busy_seconds_per_call"] = [round(t / self.calls, 4) for t in self.busy_totals]
      state.summary["stragglers_warned"] = sorted(self.watch.ever_warned)
