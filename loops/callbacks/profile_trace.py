"""ProfileTrace: a profiler trace of summary.profile_steps = (first, last), rounded out to whole train calls, by
the chief into workdir/profile (the other processes' writers do not trace: Writer.start_trace says why)."""

from loops.core.interfaces import Callback


class ProfileTrace(Callback):
  """Starts the profiler before the call that reaches `first` and stops it after the call that reaches `last`."""

  def __init__(self, profile_steps, steps_per_loop, workers=1):
    self.range, self.steps_per_loop, self.tracing = tuple(profile_steps), steps_per_loop, False
    self.workers = workers

  READS = ("summary",)

  @classmethod
  def for_run(cls, run, summary):
    return cls(summary.profile_steps, run.parts.plan.steps_per_loop, run.parts.role.num_workers)

  def on_train_begin(self, state):
    self.on_call_end(state)

  def on_call_end(self, state):  # before the next call
    if self.range and not self.tracing and self.range[0] <= state.step + self.steps_per_loop \
        and state.step < self.range[1]:
      state.writer.start_trace("profile")
      self.tracing = True

  def after_train_call(self, state):
    if self.tracing and state.step >= self.range[1]:
      self.on_train_end(state)
      state.writer.info("profiler trace of steps %d..%d in %s/profile%s", *self.range, state.workdir,
                        " (the chief's; the other workers do not trace)" if self.workers > 1 else "")

  def on_train_end(self, state):
    if self.tracing:
      state.writer.stop_trace()
      self.tracing = False
