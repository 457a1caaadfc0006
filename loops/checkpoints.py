"""Checkpoint series under workdir/checkpoints: explicit restore, periodic save, chief vs non-chief directories."""

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import tempfile

from absl import logging
import tensorflow as tf

from loops import workdir_lock
from loops.errors import ConfigError, first_line

SCRATCH_PREFIX = "ckpt-nonchief-"


class Checkpoints:
  """Every task saves (saves may involve collectives); only the chief's series lands in the workdir.

  Non-chief tasks write to a private temporary directory (scratch_directory, one checkpoint kept: nobody reads it)
  that `close()` removes.
  """

  def __init__(self, workdir, checkpoint, step_counter, keep, is_chief, subdir="checkpoints"):
    self.directory = os.path.join(workdir, subdir)
    self._temporary = None if is_chief else scratch_directory()
    self._checkpoint, self._step_counter, self._is_chief = checkpoint, step_counter, is_chief
    self._keep = keep if is_chief else 1
    self._manager = self._make_manager()
    self._manager_handed_out = False  # once another object holds the manager, it is never replaced
    self.last_saved_step = None

  def _make_manager(self):
    return tf.train.CheckpointManager(self._checkpoint, self._temporary or self.directory, max_to_keep=self._keep,
                                      step_counter=self._step_counter)

  def restore_latest(self):
    """Restores the chief's latest readable checkpoint; returns its path or None. Never partial.

    A checkpoint whose files are damaged (torn write, bad disk: checksum or size errors) is skipped with a warning
    naming it, and the one before it is restored; the chief moves the damaged files to `unreadable/` and makes
    the restored checkpoint the latest again (at run start only: once the manager is handed out, e.g. to the
    preemption handler, it is kept, and the files are moved at the next start). A readable checkpoint that does
    not match the model is refused.
    """
    candidates = index_paths(self.directory)
    if not candidates:
      return None
    damaged = []
    for path in candidates:
      damage = unreadable(path)
      if damage:
        logging.warning("checkpoint %s is unreadable (%s): skipping it", path, damage)
        damaged.append(path)
        continue
      try:
        self._checkpoint.restore(path).assert_existing_objects_matched()
      except (AssertionError, ValueError, LookupError, tf.errors.OpError) as e:
        raise ConfigError(f"checkpoint {path} does not match this model/optimizer (another model or shape?): "
                          f"{first_line(e)}; use a new --workdir") from None
      logging.info("restored %s", path)
      if damaged and self._is_chief and not self._manager_handed_out:
        self._set_aside(damaged, path, [p for p in candidates if p not in damaged])
      return path
    raise ConfigError(f"no readable checkpoint in {self.directory} (tried {', '.join(map(os.path.basename, candidates))}"
                      f"); move the directory away to start over")

  def _set_aside(self, damaged, latest, kept):
    """Moves damaged checkpoints' files to unreadable/ and names `latest` in the index (nothing is deleted)."""
    aside = os.path.join(self.directory, "unreadable")
    tf.io.gfile.makedirs(aside)
    for path in damaged:
      for name in tf.io.gfile.glob(path + ".*"):
        tf.io.gfile.rename(name, os.path.join(aside, os.path.basename(name)), overwrite=True)
    # Paths under self.directory, as index_paths gives them: TensorFlow writes them relative to the index.
    tf.compat.v1.train.update_checkpoint_state(self.directory, latest, all_model_checkpoint_paths=list(reversed(kept)))
    self._manager = self._make_manager()
    logging.warning("moved the unreadable checkpoint(s) to %s; %s is the latest checkpoint again", aside, latest)

  @property
  def manager(self):
    self._manager_handed_out = True
    return self._manager

  def latest(self):
    return tf.train.latest_checkpoint(self.directory)

  def save(self, step):
    path = self._manager.save(checkpoint_number=step)
    self.last_saved_step = step
    if self._is_chief:
      logging.info("saved checkpoint %s", path)
    return path if self._is_chief else None

  def close(self):
    if self._temporary:
      shutil.rmtree(self._temporary, ignore_errors=True)


def scratch_directory(root=None):
  """A new private temporary directory for a non-chief task's saves, named by host and pid. Those that dead
  processes of this host left in `root` (a task killed with SIGKILL cannot remove its own) are removed first."""
  root = root or tempfile.gettempdir()
  ours = f"{SCRATCH_PREFIX}{socket.gethostname()}-"
  for name in os.listdir(root):
    pid = name[len(ours):].split("-")[0] if name.startswith(ours) else ""
    if pid.isdigit() and not workdir_lock.pid_alive(int(pid)):
      shutil.rmtree(os.path.join(root, name), ignore_errors=True)
  return tempfile.mkdtemp(prefix=f"{ours}{os.getpid()}-", dir=root)


def index_paths(directory):
  """The checkpoints directory's index lists, latest first, as paths under `directory` (relative when it is
  relative, or any tf.io.gfile URL); [] when there is none.

  The index names its checkpoints relative to itself; TensorFlow joins them onto `directory` as it reads them,
  so they are used as they come (joining `directory` again broke every relative workdir).
  """
  state = tf.train.get_checkpoint_state(directory)
  if state is None:
    return []
  return list(dict.fromkeys([state.model_checkpoint_path, *reversed(state.all_model_checkpoint_paths)]))


def unreadable(path):
  """Why the checkpoint at `path` cannot be read back (missing file, size or checksum error), or None.

  Reads every tensor (TensorBundle verifies each one's checksum), so a restore never starts on a torn checkpoint.
  """
  try:
    reader = tf.compat.v1.train.NewCheckpointReader(path)  # load_checkpoint takes ram://.../ckpt-N for a directory
    for name in reader.get_variable_to_dtype_map():
      reader.get_tensor(name)
  except (tf.errors.OpError, IndexError, ValueError) as e:
    return f"{type(e).__name__}: {first_line(e)}"
  return None


BEST_RECORD = "best/best.json"  # in the workdir, written by the chief's writer


class BestCheckpoint:
  """Keeps the checkpoint with the best eval metric in workdir/best (one checkpoint + best.json)."""

  def __init__(self, workdir, checkpoint, step_counter, metric, mode, is_chief):
    self.metric, self.mode, self.is_chief = metric, mode, is_chief
    self._checkpoints = Checkpoints(workdir, checkpoint, step_counter, 1, is_chief, subdir="best") if metric else None
    self._record = os.path.join(workdir, BEST_RECORD)
    self.value = self.step = None
    if metric and tf.io.gfile.exists(self._record):
      with tf.io.gfile.GFile(self._record) as f:
        saved = json.load(f)
      self.value, self.step = saved["value"], saved["step"]

  def update(self, step, results, weights_context=contextlib.nullcontext):
    """Saves (inside weights_context()) when results[metric] beats the best so far (every task decides alike:
    metrics are reduced); returns the new record for best.json, or None."""
    if not self._checkpoints:
      return None
    value = results[self.metric]
    better = self.value is None or (value > self.value if self.mode == "max" else value < self.value)
    if not better or step == self.step:
      return None
    self.value, self.step = value, step
    with weights_context():
      self._checkpoints.save(step)
    return {"metric": self.metric, "value": value, "step": step}

  def summary(self):
    if not self._checkpoints:
      return {}
    return {"best_metric": self.metric, "best_value": self.value, "best_step": self.step,
            "best_checkpoint": tf.train.latest_checkpoint(self._checkpoints.directory) if self.is_chief else None}

  def close(self):
    if self._checkpoints:
      self._checkpoints.close()


def signal_numbers(names):
  """'SIGTERM,SIGUSR1' -> [signal.SIGTERM, signal.SIGUSR1]; raises ConfigError naming an unknown name."""
  numbers = []
  for name in (n.strip().upper() for n in names.split(",")):
    if not name.startswith("SIG"):
      name = "SIG" + name
    if name not in CATCHABLE_SIGNALS:
      raise ConfigError(f"preemption.signals: unknown or uncatchable signal '{name}'; valid: "
                        f"{', '.join(CATCHABLE_SIGNALS)} (comma-separated)")
    numbers.append(signal.Signals[name])
  return numbers


CATCHABLE_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGCONT")


class Preemption:
  """On one of `signals`: every task saves a checkpoint at the current step and exits with `exit_code`.

  Synchronous strategies use TensorFlow's PreemptionCheckpointHandler (it agrees on the step across workers
  through the coordination service), fed by our own signal handlers through its termination watcher (plus GCE's
  maintenance notices on GCE). Parameter-server coordinators and TPUs, which it does not cover here, get the
  equivalent: the flag is checked after each train call, then a save and exit. Checked once per train call
  (train.steps_per_loop steps), so a preempted run loses no saved work and at most one call of time.
  The default code, 143 (128 + SIGTERM), is what Kubernetes TFJob's ExitCode policy and GCE treat as "restart me".
  """

  def __init__(self, strategy, multi_worker, checkpoints, use_flag, signals="SIGTERM", exit_code=143):
    self._checkpoints, self._exit_code = checkpoints, exit_code
    self._handler = None
    self._flag = threading.Event()
    self._received = None
    self._previous = {}
    for number in signal_numbers(signals):
      self._previous[number] = signal.signal(number, self._on_signal)
    if not use_flag:
      resolver = (strategy.cluster_resolver if multi_worker
                  else tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({})))
      config = tf.distribute.experimental.TerminationConfig(
          termination_watcher_fn=_with_platform_notices(self._flag.is_set), exit_fn=self._exit, grace_period=0)
      self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
          resolver, checkpoints.manager, termination_config=config)
    self._before_exit = None

  def _on_signal(self, signum, frame):
    self._received = signal.Signals(signum).name
    self._flag.set()

  def save_and_exit_if_preempted(self, step, before_exit=None):
    self._before_exit = before_exit
    if self._handler is not None:
      self._handler.save_checkpoint_if_preempted(checkpoint_number=step)
    elif self._flag.is_set():
      self._checkpoints.save(step)
      self._exit()

  def _exit(self):
    logging.warning("preempted (%s): checkpoint saved; exiting with code %d; rerun the same command to resume",
                    self._received or "by a peer or the platform", self._exit_code)
    if self._before_exit:
      self._before_exit()
    logging.flush()
    sys.exit(self._exit_code)

  def close(self):
    for number, previous in self._previous.items():
      signal.signal(number, previous)


def _with_platform_notices(watcher):
  """Adds, on GCE, TensorFlow's maintenance-event watcher (a custom watcher replaces it). The platform probe (an
  HTTP request, up to 5 s) runs once, in the handler's polling thread, not in the run's start-up."""
  from tensorflow.python.distribute.failure_handling import failure_handling_util as util
  on_gce = []

  def watch():
    if not on_gce:
      on_gce.append(util.on_gcp())
    return watcher() or (on_gce[0] and util.termination_watcher_function_gce())

  return watch
