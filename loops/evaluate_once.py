"""A chosen checkpoint evaluated once (mode=evaluate with eval.checkpoint set): the run's latest, its best, a step,
or a checkpoint path, on the configured eval split; every eval metric of the run (a task's whole-set metrics too)
written to workdir/eval/<data>_<split>/checkpoint-<step>.json and to TensorBoard there under eval_checkpoint/<name>
at that step (other data or another split beside it, never over it). Today's sidecar (eval.checkpoint="") watches
the training's checkpoints instead (loops/sidecar.py).

  python main.py --config=configs/digits_cnn.py --workdir=runs/digits --config.mode=evaluate \\
      --config.eval.checkpoint=best
"""

import posixpath
import re

from absl import logging
import tensorflow as tf

from errors import ConfigError
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import writers
from loops.persist.writers import format_values

SELECTORS = ("latest", "best")
TAG = "eval_checkpoint"
FILE_SOURCES = ("image_folder", "npz", "tfrecord")  # their data.data_dir is the data (others': a tfds root)


def chosen(workdir, selector, key="eval.checkpoint"):
  """(step, path) of the checkpoint `selector` (the setting `key`) names in `workdir`; ConfigError naming what
  there is otherwise."""
  directory = posixpath.join(workdir, "checkpoints")
  steps = checkpoints_lib.steps_of(directory)
  if selector == "latest":
    if not steps:
      raise ConfigError(f"{key}=latest: {directory} holds no checkpoint")
    return steps[-1]
  if selector == "best":
    for folder in (posixpath.join(workdir, "best"), posixpath.join(workdir, "eval", "best")):
      best = checkpoints_lib.steps_of(folder)
      if best:
        return best[-1]
    raise ConfigError(f"{key}=best: no best checkpoint in {workdir}/best or {workdir}/eval/best (the run "
                      "keeps one when checkpoint.best_metric is set)")
  if isinstance(selector, int) or str(selector).isdigit():
    found = dict(steps).get(int(selector))
    if found is None:
      listed = ", ".join(str(step) for step, _ in steps) or "none"
      raise ConfigError(f"{key}={selector}: no checkpoint of step {selector} in {directory} (steps: "
                        f"{listed})")
    return int(selector), found
  return _path(str(selector), key)


def _path(path, key):
  """(step, path) of a checkpoint prefix (…/ckpt-300) or of a directory's latest checkpoint."""
  if tf.io.gfile.isdir(path):
    steps = checkpoints_lib.steps_of(path)
    if not steps:
      raise ConfigError(f"{key}='{path}': the directory holds no checkpoint index")
    return steps[-1]
  if not tf.io.gfile.exists(path + ".index"):
    raise ConfigError(f"{key}='{path}' is neither 'latest', 'best', a step nor a checkpoint (no "
                      f"{path}.index)")
  step = checkpoints_lib.saved_step(path)  # any name: the step the run saved in it
  if step is None:
    damage = checkpoints_lib.unreadable(path)
    raise ConfigError(f"{key}: {path} cannot be read ({damage})" if damage else
                      f"{key}='{path}' holds no step counter: not a checkpoint of this framework's runs")
  return step, path


def input_name(data_settings):
  """The eval input in a file or directory name: `<data>_<split>`, <data> the file or folder name of a file
  source's data.data_dir, else the data's name (a tfds data_dir is the root of all datasets)."""
  if data_settings.name in FILE_SOURCES:
    data_name = posixpath.splitext(posixpath.basename(data_settings.data_dir.rstrip("/")))[0]
  else:
    data_name = data_settings.name.split(":")[-1]
  return safe(f"{data_name}_{data_settings.eval_split}")


def input_described(data_settings):
  """The eval input as records name it: `<data.name>:<split>[ in <data.data_dir>]`."""
  where = f" in {data_settings.data_dir}" if data_settings.data_dir else ""
  return f"{data_settings.name}:{data_settings.eval_split}{where}"


def safe(name):
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def run(data_settings, workdir, parts, selection, make_execution):
  """Evaluates the checkpoint `selection` ((step, path) of chosen) once on data.eval_split through make_execution()
  (loops/distribute/execution.make); returns its results with the step and the input."""
  step, path = selection
  out_dir = posixpath.join(workdir, "eval", input_name(data_settings))
  name, described = f"checkpoint-{step}.json", input_described(data_settings)
  _refuse_other_input(posixpath.join(out_dir, name), described)
  restore_chosen(parts, path)
  results = make_execution().evaluate()
  record = {"checkpoint": path, "step": step, "input": described, "split": data_settings.eval_split, **results}
  writer = writers.Writer(out_dir)
  try:
    writer.scalars(step, {f"{TAG}/{metric.split('/', 1)[-1]}": value for metric, value in results.items()})
    writer.write_json(name, record)
  finally:
    writer.close()
  logging.info("evaluated %s (step %d) on %s: %s; written to %s", path, step, described, format_values(results),
               posixpath.join(out_dir, name))
  return record


def _refuse_other_input(path, described):
  """One line when `path` holds the evaluation of another input of the same name (another file called so)."""
  there = (writers.read_json(path) or {"input": described}).get("input")
  if there != described:
    raise ConfigError(f"{path} holds the evaluation of {there!r}, not of {described!r}: remove it to evaluate "
                      "this input")


def restore_chosen(parts, path, key="eval.checkpoint"):
  """The chosen checkpoint `path` restored by the owner (Checkpoints.restore_to_evaluate); a damaged one is one line
  naming the setting `key`."""
  damage = checkpoints_lib.Checkpoints.restore_to_evaluate(parts.checkpoint, path)
  if damage:
    raise ConfigError(f"{key}: {path} cannot be read ({damage})")
