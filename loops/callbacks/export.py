"""Export: at the end (chief), workdir/export/model.keras (the logits of the model) and workdir/export/saved_model
(the serving SavedModel: raw images in, the eval's preprocessing inside, probabilities and classes out); EMA
weights when kept."""

from loops.core.interfaces import Callback
from loops.model import model as model_lib
from loops.model import serving


class Export(Callback):
  """At the end, when config.export is set: workdir/export/model.keras (the logits of the model) and
  workdir/export/saved_model (loops/model/serving.py), both with the averaged weights under optimizer.ema_decay
  (`weights_context`). summary["export"] = {"keras": path, "saved_model": path} (None when nothing was written).

  preprocess: fn(raw images) -> the eval's inputs (data.eval_images); image_spec: the raw images' tf.TensorSpec.
  """

  def __init__(self, model, enabled, weights_context, preprocess, image_spec):
    self.model, self.enabled, self.weights_context = model, enabled, weights_context
    self.preprocess, self.image_spec = preprocess, image_spec

  def on_train_end(self, state):
    paths = None
    if self.enabled:
      with self.weights_context():
        keras_path = state.writer.save_model(model_lib.logits_model(self.model), "export/model.keras")
        saved_model = state.writer.save_saved_model(self._write_saved_model, "export/saved_model")
      if keras_path:
        paths = {"keras": keras_path, "saved_model": saved_model}
        state.writer.info("exported %s and %s", keras_path, saved_model)
    state.summary["export"] = paths

  def _write_saved_model(self, path):
    serving.write_saved_model(self.model, self.preprocess, self.image_spec, path)
