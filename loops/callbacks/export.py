"""Export: at the end, workdir/export/model.keras (chief), the logits of the model (EMA weights when kept)."""

from loops.core.interfaces import Callback
from loops.model import model as model_lib


class Export(Callback):
  """At the end: workdir/export/model.keras (chief), when config.export is set: the logits of the model, with
  the averaged weights under optimizer.ema_decay (`weights_context`)."""

  def __init__(self, model, enabled, weights_context):
    self.model, self.enabled, self.weights_context = model, enabled, weights_context

  def on_train_end(self, state):
    path = None
    if self.enabled:
      with self.weights_context():
        path = state.writer.save_model(model_lib.logits_model(self.model), "export/model.keras")
    if path:
      state.writer.info("exported %s", path)
    state.summary["export"] = path
