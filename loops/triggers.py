"""When periodic work is due, and how long the next train call may be. Pure Python: no TensorFlow."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Trigger:
  """Due every `every_steps` steps (0 = never), counted from step 0.

  A call that runs from step `prev` to `step` crosses a boundary when prev // n < step // n, so a trigger fires
  once per boundary whatever the calls' lengths (CLU's `step % n == 0` misses boundaries inside a call).
  """
  every_steps: int

  def due(self, prev, step):
    n = self.every_steps
    return n > 0 and prev // n < step // n

  def next_boundary(self, step):
    """The first boundary after `step`, or None when the trigger never fires."""
    n = self.every_steps
    return (step // n + 1) * n if n > 0 else None


def call_length(step, total_steps, steps_per_loop, triggers=()):
  """Steps of the next train call from `step`: up to the next multiple of steps_per_loop, shortened to end on
  the next boundary of any trigger and at total_steps."""
  end = min(total_steps, (step // steps_per_loop + 1) * steps_per_loop)
  for trigger in triggers:
    boundary = trigger.next_boundary(step)
    if boundary is not None:
      end = min(end, boundary)
  return end - step
