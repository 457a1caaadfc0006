"""EvalLog: after each eval, the eval/... scalars and a console line."""

from loops.core.interfaces import Callback
from loops.persist.writers import format_values


class EvalLog(Callback):

  @classmethod
  def for_run(cls, run):
    return cls()

  def after_eval(self, state):
    state.writer.scalars(state.step, dict(state.eval))
    state.writer.info("eval at step %d: %s", state.step, format_values(state.eval))
