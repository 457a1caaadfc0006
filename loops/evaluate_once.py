"""A chosen checkpoint evaluated once (mode=evaluate with eval.checkpoint set): the run's latest, its best, a step,
or a checkpoint path, on the configured eval split; every eval metric of the run (a task's whole-set metrics too)
written to workdir/eval/checkpoint-<step>.json and to TensorBoard under eval_checkpoint/<name> at that step. Today's
sidecar (eval.checkpoint="") watches the training's checkpoints instead (loops/sidecar.py).

  python main.py --config=configs/digits_cnn.py --workdir=runs/digits --config.mode=evaluate \\
      --config.eval.checkpoint=best
"""

import posixpath

from absl import logging
import tensorflow as tf

from errors import ConfigError
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import writers
from loops.persist.writers import format_values

SELECTORS = ("latest", "best")
TAG = "eval_checkpoint"


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
  tail = path.rsplit("-", 1)
  return (int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else -1), path


def run(eval_split, workdir, parts, selection, make_execution):
  """Evaluates the checkpoint `selection` ((step, path) of chosen) once on `eval_split` (data.eval_split) through
  make_execution() (loops/distribute/execution.make); returns its results with the step."""
  step, path = selection
  restore_chosen(parts, path)
  results = make_execution().evaluate()
  record = {"checkpoint": path, "step": step, "split": eval_split, **results}
  eval_dir = posixpath.join(workdir, "eval")
  writer = writers.Writer(eval_dir)
  try:
    writer.scalars(max(step, 0), {f"{TAG}/{name.split('/', 1)[-1]}": value for name, value in results.items()})
    writer.write_json(f"checkpoint-{step}.json", record)
  finally:
    writer.close()
  logging.info("evaluated %s (step %d) on the '%s' split: %s; written to %s", path, step, eval_split,
               format_values(results), posixpath.join(eval_dir, f"checkpoint-{step}.json"))
  return record


def restore_chosen(parts, path, key="eval.checkpoint"):
  """The chosen checkpoint `path` restored by the owner (Checkpoints.restore_to_evaluate); a damaged one is one line
  naming the setting `key`."""
  damage = checkpoints_lib.Checkpoints.restore_to_evaluate(parts.checkpoint, path)
  if damage:
    raise ConfigError(f"{key}: {path} cannot be read ({damage})")
