"""Export: at the end (chief), workdir/export/model.keras (the model; the logits of a classifier),
workdir/export/saved_model (the serving SavedModel) and, with export_tflite, workdir/export/model.tflite (LiteRT);
EMA weights when kept. What can be written is decided before training: a model Keras cannot serialise (a subclass
without get_config) gets its weights (export/model.weights.h5) instead of a .keras file, a task whose predict_step
cannot be traced on its features no SavedModel, each said in one line; a failing export never loses the summary."""

import posixpath

from absl import logging

from errors import described
import data
from loops.core.interfaces import Callback
from loops.modeling import litert
from loops.modeling import model as model_lib
from loops.modeling import serving
from loops import task as task_lib

EXPORTS = ("export/model.keras", "export/model.weights.h5", "export/saved_model", "export/model.tflite")


class ClassifierServing:
  """The built-in classifier's: raw images through the eval's preprocessing to probabilities and classes."""

  def __init__(self, model, preprocess, image_spec, max_value=255):
    self.model, self.preprocess, self.input_spec, self.max_value = model, preprocess, image_spec, max_value

  def problem(self):
    return None

  def write_saved_model(self, path):
    serving.write_saved_model(self.model, self.preprocess, self.input_spec, path, self.max_value)

  def lite(self):
    """(models, fn, input signature) of the LiteRT export."""
    return ([self.model], *serving.lite_classifier(self.model, self.preprocess, self.input_spec))


class TaskServing:
  """A task's: its features (Task.serving_spec) to its predict_step's outputs."""

  def __init__(self, task, models, features_spec):
    self.models, self.input_spec = list(models.values()), features_spec
    self.predict = task_lib.serving_predict(task, models)

  def problem(self):
    return serving.serving_problem(self.predict, self.input_spec)

  def write_saved_model(self, path):
    serving.write_task_saved_model(self.models, self.predict, self.input_spec, path)

  def lite(self):
    return self.models, self.predict, [serving.batched(self.input_spec)]


class Export(Callback):
  """At the end, when config.export is set: the model file, the serving SavedModel (loops/modeling/serving.py)
  and, with export_tflite, export/model.tflite (loops/modeling/litert.py), all with the averaged weights under
  optimizer.ema_decay (`weights_context`). summary["export"] = {"keras" or "weights": path, "saved_model": path}
  (None when nothing was written; with "error" when writing failed), with export_tflite also "tflite": path or
  None and, when the converter refused, "tflite_error": its one line.

  serves: ClassifierServing or TaskServing; logits: model.keras holds the logits model (the built-in classifier).
  """

  def __init__(self, model, enabled, weights_context, serves, logits=False, tflite=False):
    self.model, self.enabled, self.weights_context = model, enabled, weights_context
    self.serves, self.logits, self.tflite = serves, logits, enabled and tflite
    self.keras_file_problem = serving.keras_file_problem(model) if enabled else None
    self.serving_problem = serves.problem() if enabled else None

  READS = ("run", "task")

  @classmethod
  def for_run(cls, run, run_settings, task):
    """The built-in classification serves raw images through the eval's preprocessing; a task serves its
    predict_step on its features (Task.serving_spec)."""
    parts = run.parts
    if task.name == task_lib.BUILT_IN:
      serves = ClassifierServing(parts.main_model, data.eval_images(parts.source, parts.data_settings),
                                 data.raw_image_spec(parts.source), parts.source.max_value)
    else:
      serves = TaskServing(parts.task, parts.models, parts.task.serving_spec(parts.element_spec[0]))
    return cls(parts.main_model, run_settings.export, run.execution.averaged_weights, serves,
               logits=task.name == task_lib.BUILT_IN, tflite=run_settings.export_tflite)

  def on_train_begin(self, state):
    if self.serving_problem:
      state.writer.warning("export: the task's predict_step cannot serve its features %s (%s); no serving "
                           "SavedModel%s (Task.serving_spec names what it takes; export=False turns the export off)",
                           self.serves.input_spec, self.serving_problem, " or model.tflite" if self.tflite else "")
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
        state.writer.warning("export failed: %s (the checkpoints are complete; export=False skips it)", described(e))
        paths = {"error": described(e)}
    state.summary["export"] = paths

  def _write(self, state):
    with self.weights_context():
      if self.keras_file_problem:
        kind, model_path = "weights", state.writer.save_weights(self.model, "export/model.weights.h5")
      else:
        exported = model_lib.logits_model(self.model) if self.logits else self.model
        kind, model_path = "keras", state.writer.save_model(exported, "export/model.keras")
      saved_model = None if self.serving_problem else state.writer.save_saved_model(self.serves.write_saved_model,
                                                                                   "export/saved_model")
      lite = self._write_tflite(state) if self.tflite else {}
    if not model_path:
      return None
    written = [path for path in (model_path, saved_model, lite.get("tflite")) if path]
    state.writer.info("exported %s", " and ".join([", ".join(written[:-1]), written[-1]] if written[1:] else written))
    for name in EXPORTS:  # an earlier export's file this one did not write would hold older weights beside it
      if posixpath.join(state.writer.workdir, name) not in written:
        stale = state.writer.remove(name)
        if stale:
          state.writer.info("removed %s: an earlier export's, not written this time", stale)
    if state.writer.trackers:
      state.writer.trackers.export(posixpath.dirname(model_path))
    return {kind: model_path, "saved_model": saved_model, **lite}

  def _write_tflite(self, state):
    """{"tflite": path or None} (and "tflite_error": the converter's refusal, said in one warning line)."""
    if self.serving_problem:
      return {"tflite": None}
    models, fn, signature = self.serves.lite()
    try:
      return {"tflite": state.writer.save_saved_model(lambda path: litert.write_tflite(models, fn, signature, path),
                                                      "export/model.tflite")}
    except litert.Unconvertible as e:
      state.writer.warning("export: no model.tflite: %s (the SavedModel and model.keras are written; "
                           "export_tflite=False skips it)", e)
      return {"tflite": None, "tflite_error": str(e)}
