"""Training-time bookkeeping: steps/s, images/s, ETA and time per epoch, excluding eval and checkpoint time."""

import time


def throughput_unit(source):
  """What the throughput counts: "images" for a source of images (the built-in sources), "examples" for other
  features (a task's arrays or input function: sequences, tables, dicts)."""
  return "images" if getattr(source, "image_shape", None) is not None else "examples"


class Progress:
  """Feed it each train call with `record(step, seconds)`; it keeps train time only.

  The first call after start-up includes tracing: it is left out of rates, ETA and epoch times.
  """

  def __init__(self, start_step, total_steps, global_batch_size, steps_per_epoch, clock=time.perf_counter):
    self.clock = clock
    self.total_steps = total_steps
    self.global_batch_size = global_batch_size
    self.steps_per_epoch = steps_per_epoch
    self._step = start_step
    self._train_seconds = 0.0
    self._rate_steps = 0
    self._rate_seconds = 0.0
    self._first_call = True
    self._last = (0, 0.0)  # (steps, seconds) of the latest call
    self._epoch_start_seconds = 0.0 if start_step % steps_per_epoch == 0 else None
    self.epoch_seconds = {}  # epoch number (1-based) -> train seconds, for epochs run whole in this process

  def record(self, step, seconds):
    """A train call ended at `step` after `seconds`; returns {epoch: seconds} of epochs it completed.

    Epochs are timed between boundaries interpolated inside calls; an epoch that overlaps the first call
    (tracing) or started before this process is not timed.
    """
    steps = step - self._step
    finished = {}
    for boundary in range((self._step // self.steps_per_epoch + 1) * self.steps_per_epoch, step + 1,
                          self.steps_per_epoch):
      at = self._train_seconds + seconds * (boundary - self._step) / steps  # interpolated inside the call
      if self._epoch_start_seconds is not None and not self._first_call:
        finished[boundary // self.steps_per_epoch] = at - self._epoch_start_seconds
      self._epoch_start_seconds = at
    if self._first_call and step % self.steps_per_epoch:
      self._epoch_start_seconds = None  # the epoch in progress began during tracing
    self.epoch_seconds.update(finished)
    self._step = step
    self._train_seconds += seconds
    if self._first_call:
      self._first_call = False
    else:
      self._rate_steps += steps
      self._rate_seconds += seconds
    self._last = (steps, seconds)
    return finished

  @property
  def train_seconds(self):
    return self._train_seconds

  def steps_per_sec(self):
    """Mean rate since start-up, excluding the first (tracing) call; the last call's rate until then."""
    if self._rate_seconds > 0:
      return self._rate_steps / self._rate_seconds
    steps, seconds = self._last
    return steps / seconds if seconds > 0 else 0.0

  def steady(self):
    """Whether the rates leave out the first call (a call came after it)."""
    return self._rate_seconds > 0

  def examples_per_sec(self):
    return self.steps_per_sec() * self.global_batch_size

  def eta_seconds(self):
    rate = self.steps_per_sec()
    return (self.total_steps - self._step) / rate if rate > 0 else float("inf")

  def mean_epoch_seconds(self):
    """Mean time per epoch excluding the first (the seeds' measure): of every timed epoch, the first call's
    (tracing) never being one; None until one is known."""
    timed = list(self.epoch_seconds.values())
    return sum(timed) / len(timed) if timed else None


def format_duration(seconds):
  if seconds == float("inf"):
    return "?"
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
