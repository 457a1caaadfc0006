"""Export: at the end (chief), workdir/export/model.keras (the model; the logits of a classifier) and
workdir/export/saved_model (the serving SavedModel); EMA weights when kept. What can be written is decided before
training (`plan`): a model Keras cannot serialise (a subclass without get_config) gets its weights
(export/model.weights.h5) instead of a .keras file, said in one line; a failing export never loses the summary."""

import posixpath

from absl import logging

from errors import first_line
import data
from loops.core.interfaces import Callback
from loops.modeling import model as model_lib
from loops.modeling import serving
from loops import task as task_lib


class Export(Callback):
  """At the end, when config.export is set: the model file and the serving SavedModel (loops/modeling/serving.py),
  both with the averaged weights under optimizer.ema_decay (`weights_context`).
  summary["export"] = {"keras" or "weights": path, "saved_model": path} (None when nothing was written; with
  "error" when writing failed).

  preprocess: fn(raw images) -> the eval's inputs (data.eval_images), None for a task's own features (served as
  they are); input_spec: the raw inputs' spec (a batch).
  """

  def __init__(self, model, enabled, weights_context, preprocess, input_spec):
    self.model, self.enabled, self.weights_context = model, enabled, weights_context
    self.preprocess, self.input_spec = preprocess, input_spec
    self.keras_file_problem = serving.keras_file_problem(model) if enabled else None
    serves = enabled and preprocess is None
    self.serving_problem = serving.serving_problem(model, input_spec) if serves else None


  @classmethod
  def for_run(cls, run):
    """The built-in classification serves raw images through the eval's preprocessing; a task serves its
    features as its model takes them."""
    parts, enabled, weights = run.parts, run.config.export, run.execution.averaged_weights
    if run.config.task.name == task_lib.BUILT_IN:
      return cls(parts.main_model, enabled, weights, data.eval_images(parts.source, run.config.data),
                 data.raw_image_spec(parts.source))
    return cls(parts.main_model, enabled, weights, None, parts.task.serving_spec(parts.element_spec[0]))

  def on_train_begin(self, state):
    if self.serving_problem:
      state.writer.warning("export: model '%s' does not take the task's features %s (%s); no serving SavedModel "
                           "(Task.serving_spec names what it takes; export=False turns the export off)",
                           self.model.name, self.input_spec, self.serving_problem)
    if self.keras_file_problem:
      state.writer.warning("export: model '%s' cannot be saved as a .keras file (%s); exporting its weights as "
                           "export/model.weights.h5 and the serving SavedModel instead (export=False turns the "
                           "export off)", self.model.name, self.keras_file_problem)

  def on_train_end(self, state):
    paths = None
    if self.enabled:
      try:
        paths = self._write(state)
      except Exception as e:  # pylint: disable=broad-except  # after training: the run's record must survive
        logging.debug("export failed", exc_info=True)
        state.writer.warning("export failed: %s: %s (the checkpoints are complete; export=False skips it)",
                             type(e).__name__, first_line(e))
        paths = {"error": f"{type(e).__name__}: {first_line(e)}"}
    state.summary["export"] = paths

  def _write(self, state):
    with self.weights_context():
      if self.keras_file_problem:
        kind, model_path = "weights", state.writer.save_weights(self.model, "export/model.weights.h5")
      else:
        exported = model_lib.logits_model(self.model) if self.preprocess is not None else self.model
        kind, model_path = "keras", state.writer.save_model(exported, "export/model.keras")
      saved_model = None if self.serving_problem else state.writer.save_saved_model(self._write_saved_model,
                                                                                   "export/saved_model")
    if not model_path:
      return None
    state.writer.info("exported %s%s", model_path, f" and {saved_model}" if saved_model else "")
    if state.writer.trackers:
      state.writer.trackers.export(posixpath.dirname(model_path))
    return {kind: model_path, "saved_model": saved_model}

  def _write_saved_model(self, path):
    if self.preprocess is None:
      serving.write_task_saved_model(self.model, self.input_spec, path)
    else:
      serving.write_saved_model(self.model, self.preprocess, self.input_spec, path)
