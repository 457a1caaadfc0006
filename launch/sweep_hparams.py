"""TensorBoard's HParams dashboard for a sweep: the experiment (the swept keys as HParams with their values, the
eval metrics as Metrics) written once at DIR, so `tensorboard --logdir DIR` shows every trial side by side.

Each trial's workdir (a run of DIR) holds its session: the Overview callback writes the trial's config as hparams
at step 0, and the run its eval scalars. The trials run with summary.hparams_experiment=False, so this is the only
experiment under DIR (TensorBoard takes the first one it finds). Written in TensorBoard's record format without
importing TensorFlow.
"""

import glob
import os
import socket
import time

SUFFIX = ".sweep-hparams"


def _domain(values, hp):
  """A Discrete domain of one type (numbers, booleans or text), an interval for a range, None when mixed."""
  from launch import sweep_grid  # pylint: disable=import-outside-toplevel

  if isinstance(values, sweep_grid.Range):
    if values.kind == "int":
      return hp.IntInterval(int(values.low), int(values.high))
    return hp.RealInterval(float(values.low), float(values.high))
  typed = [sweep_grid.typed(v) for v in values]
  if all(isinstance(v, bool) for v in typed):
    return hp.Discrete(typed)
  if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in typed):
    return hp.Discrete([float(v) for v in typed])
  if all(isinstance(v, str) for v in typed):
    return hp.Discrete(typed)
  return None


def write_experiment(sweep_dir, grid, metrics):
  """Writes DIR/events.out.tfevents.*.sweep-hparams (replacing an earlier one): the experiment config."""
  from tensorboard.compat.proto import event_pb2  # pylint: disable=import-outside-toplevel
  from tensorboard.plugins.hparams import summary_v2 as hp  # pylint: disable=import-outside-toplevel
  from tensorboard.summary.writer.record_writer import RecordWriter  # pylint: disable=import-outside-toplevel

  for old in glob.glob(os.path.join(glob.escape(sweep_dir), "events.out.tfevents.*" + SUFFIX)):
    os.remove(old)
  summary = hp.hparams_config_pb(hparams=[hp.HParam(key, _domain(values, hp)) for key, values in grid.items()],
                                 metrics=[hp.Metric(tag) for tag in metrics])
  now = time.time()
  path = os.path.join(sweep_dir, f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}{SUFFIX}")
  with open(path, "wb") as f:  # TensorBoard's own record format, without importing TensorFlow
    writer = RecordWriter(f)
    writer.write(event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
    writer.write(event_pb2.Event(wall_time=now, step=0, summary=summary).SerializeToString())
    writer.flush()
  return path
