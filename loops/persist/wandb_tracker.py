"""WandbTracker: one Weights & Biases run per workdir (WANDB_MODE=offline keeps it in workdir/wandb for
`wandb sync`). Its methods run in the tracking thread (loops/persist/tracking.py), never in a train call."""

import os
import shutil
import tempfile
import uuid

STEP = "step"  # every value is plotted against the run's global step, so values of earlier steps are kept too


class WandbTracker:
  """A run in W&B project `project` named `run_name` (in `group` when a sweep set it)."""

  def __init__(self, project, run_name, group, workdir):
    self.project, self.run_name, self.group = project, run_name, group
    self.directory = workdir if "://" not in workdir else tempfile.mkdtemp(prefix="wandb-")
    self.run, self.logged = None, -1

  def open(self, run_id):
    """Continues run_id (resume='allow'), or starts a run under a new id; returns the id."""
    import wandb  # pylint: disable=import-outside-toplevel

    run_id = run_id or uuid.uuid4().hex[:8]
    settings = wandb.Settings(console="off", silent=True)  # the run's console stays the run's
    self.run = wandb.init(project=self.project, id=run_id, resume="allow", name=self.run_name,
                          group=self.group or None, dir=self.directory, settings=settings)
    self.run.define_metric(STEP)
    self.run.define_metric("*", step_metric=STEP)
    self.logged = self.run.summary.get(STEP, -1) if self.run.resumed else -1  # offline: W&B does not know it
    return run_id

  def params(self, values):
    self.run.config.update(dict(values), allow_val_change=True)

  def metrics(self, points):
    """points: [(step, {tag: value}, timestamp in ms)]; a step an earlier attempt logged (online: the run's
    summary says which) is not sent again (see MlflowTracker.metrics)."""
    for step, values, _ in points:
      if step > self.logged:
        self.run.log({**values, STEP: step})

  def tags(self, values):
    self.run.tags = tuple(sorted({*self.run.tags, *(f"{key}:{value}"[:64] for key, value in values.items())}))

  def artifact(self, path, folder):
    """A copy in the run's files (as `folder`/name), saved now."""
    copy = os.path.join(self.run.dir, folder, os.path.basename(path))
    if os.path.isdir(path):
      shutil.copytree(path, copy, dirs_exist_ok=True)
      self.run.save(os.path.join(copy, "**"), base_path=self.run.dir, policy="now")
    else:
      os.makedirs(os.path.dirname(copy), exist_ok=True)
      shutil.copyfile(path, copy)
      self.run.save(copy, base_path=self.run.dir, policy="now")

  def finish(self, status):
    self.run.finish(exit_code=0 if status == "FINISHED" else 1)

