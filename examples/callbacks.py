"""A callback: stop once eval/accuracy reaches a target, and record when in summary.json.

    python main.py --config=configs/digits_cnn.py --workdir=runs/target \
        --config.eval.every_steps=100 --config.callbacks="('examples.callbacks:stop_at_target_accuracy',)"

Expected (2-core CPU, ~10 s with start-up): the run stops at step 200 of its 1100; summary.json has
"stopped_early": "eval/accuracy 0.9750 reached the target 0.95 at step 200" and "target_reached_at_step": 200.
Every process runs every callback; request_stop on any worker stops all workers at the same step.
"""

from loops.callbacks import Callback

TARGET = 0.95


class StopAtTargetAccuracy(Callback):  # subclassing is optional: any object with some of the hooks works

  def __init__(self, target=TARGET):
    self.target = target

  def after_eval(self, state):
    accuracy = state.eval.get("eval/accuracy")
    if accuracy is not None and accuracy >= self.target and state.stop_reason is None:
      state.summary["target_reached_at_step"] = state.step
      state.writer.scalars(state.step, {"custom/target_reached": 1.0})
      state.request_stop(f"eval/accuracy {accuracy:.4f} reached the target {self.target} at step {state.step}")


def stop_at_target_accuracy(config):
  del config  # a factory gets the run's config; this one needs nothing from it
  return StopAtTargetAccuracy()
