"""The run's checkpoints, one owner and their only reader: what a checkpoint holds (`holding`), every restore as a
method of `Checkpoints` (`restore_run`, in this order: the latest checkpoint, else init.checkpoint's warm start; the
callbacks' state; the preemption handler's restore; this run's learning rates. `roll_back`: a NaN rollback.
`restore_to_evaluate`: the evaluators), and every save (periodic, final, best, on a preemption, on an error; blocking
or asynchronous). `Series` is one directory's series: explicit restore (never partial, damaged checkpoints skipped),
save, and where each process's saves go (the chief's into the workdir, the others' into private scratch directories).
`init_checkpoint.py` is the warm start's reader, imported by this module only (tests/test_checkpoint_readers.py
holds every other module of the product to reading nothing)."""

import dataclasses
import os
import shutil
import socket
import tempfile
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from errors import ConfigError, described, first_line
from loops import private_apis
from loops.modeling import optimizers as optimizers_lib
from loops.persist import async_saves, init_checkpoint, workdir_lock

SCRATCH_PREFIX = "ckpt-nonchief-"
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def holding(models, optimizers, step_counter):
  """The run's tf.train.Checkpoint: the step counter, every model and optimizer (`model`/`optimizer` for the model
  named "model", else `model_<name>`/`optimizer_<name>`) and the callbacks' node (`callbacks_node`)."""
  key = lambda kind, name: kind if name == "model" else f"{kind}_{name}"
  items = {key("model", name): m for name, m in models.items()}
  items.update({key("optimizer", name): o for name, o in optimizers.items()})
  return tf.train.Checkpoint(step=step_counter, callbacks=callbacks_node(), **items)


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `Checkpoints.restore_run` brought back."""
  path: Optional[str]  # the checkpoint the run resumes from, or None (a new run)
  warm_start_table: str  # init.checkpoint's table of what it loaded, or ""
  warm_start_counts: dict  # its counts for summary.json
  preemption: Any  # the run's PreemptionWatcher (loops/persist/preemption.py), made in the order


class Checkpoints:
  """The run's checkpoints. Restores: `restore_run` (once, at a training run's start), `roll_back` (a NaN
  rollback), `restore_to_evaluate` (the sidecar, evaluate_once, predict), `inspect_warm_start` (--dry_run).

  Saves: `save(step)` (periodic; asynchronous when `async_save`), `save(step, wait=True)` (final, preemption),
  `best.save(step)` (workdir/best, one kept, blocking: BestCheckpoint), `save_on_error(state)`; the preemption
  handler saves through `manager`. `latest()`, `roll_back()` and `close()` first wait for pending writes.

  Args:
    workdir, checkpoint, step_counter, keep, is_chief, async_save: as `Series` (workdir/checkpoints).
    best: whether the best checkpoint is kept (checkpoint.best_metric set).
    init, parts, twin: the run's `init` settings, loops/build.Parts and fn() -> a twin of the run's model (for the
      warm start and the learning rates).
  """

  def __init__(self, workdir, checkpoint, step_counter, keep, is_chief, async_save=False, best=False, init=None,
               parts=None, twin=None):
    self.checkpoint, self._init, self._parts, self._twin = checkpoint, init, parts, twin
    self.series = Series(workdir, checkpoint, step_counter, keep, is_chief, async_save=async_save)
    self.best = Series(workdir, checkpoint, step_counter, 1, is_chief, subdir="best") if best else None
    self.restored = None  # the path restore_run() resumed from

  @classmethod
  def for_run(cls, checkpoint, init, strategy, workdir, parts, twin):
    """The training run's checkpoints: `checkpoint` and `init` settings, the strategy's name, loops/build.Parts,
    fn() -> a twin of the run's model (the warm start loads .h5 weights into it)."""
    return cls(workdir, parts.checkpoint, parts.step_counter, checkpoint.keep, parts.role.is_chief,
               async_save=async_saves.async_save_enabled(checkpoint.async_save, strategy),
               best=bool(checkpoint.best_metric), init=init, parts=parts, twin=twin)

  directory = property(lambda self: self.series.directory)
  last_saved_step = property(lambda self: self.series.last_saved_step)
  manager = property(lambda self: self.series.manager)

  def restore_run(self, built_ins, users, preemption):
    """A training run's whole restore, in its one order, before anything is written (refusals are one line):

      1. the latest checkpoint (refusing one of another model), else init.checkpoint's warm start (a resumed run
         ignores it);
      2. every callback's state (`attach`: `built_ins` and `users`), as the restored checkpoint holds it;
      3. `preemption(self)` makes the run's PreemptionWatcher: TensorFlow's PreemptionCheckpointHandler restores
         the latest checkpoint again when it is made (with its own counter, now in the checkpoint);
      4. this run's learning rates over the restored ones (a resume may change them).

    Returns `Restored`.
    """
    self.restored = self.series.restore_latest()
    table, counts = self._warm_start()
    attach(self.checkpoint, built_ins, users, self.restored)
    watcher = preemption(self)
    self._reset_learning_rates()
    return Restored(self.restored, table, counts, watcher)

  def roll_back(self):
    """A NaN rollback: `restore_run`'s order on a run in progress; returns the restored path.

    The latest checkpoint, every callback's state with it (attached at the start: `_restore` assigns what the
    checkpoint holds for them), then this run's learning rates (a checkpoint of the run before a resume holds that
    run's). Skipped: the warm start (there is always a checkpoint: NanGuard saves one before training when there is
    none) and the preemption handler (made once per run; its counter is in the checkpoint, restored here with it).
    """
    path = self.series.restore_latest()
    self._reset_learning_rates()
    return path

  @staticmethod
  def restore_to_evaluate(checkpoint, path):
    """An evaluator's restore (the sidecar, evaluate_once, predict) of `path` into the run's `checkpoint`: the
    models and optimizers as saved, refusing another model's; why `path` cannot be read (nothing restored), else
    None. No warm start, callbacks' state, preemption handler or learning rates: an evaluator trains nothing."""
    damage = unreadable(path)
    if damage is None:
      _restore(checkpoint, path)
    return damage

  @staticmethod
  def inspect_warm_start(init, parts, twin):
    """--dry_run: '<source>: <counts>' of what init.checkpoint would load, read with the run's checks (a refusal
    raises here), nothing assigned."""
    source, _, result = init_checkpoint.inspect(init, parts.main_model, twin)
    return f"{source.description}: {result.counts()}"

  def _warm_start(self):
    """init.checkpoint into a new run's model: (its table or "", its counts)."""
    init = self._init
    if not init or not init.checkpoint:
      return "", {}
    if self.restored:
      logging.warning("resuming from %s: init.checkpoint '%s' is ignored (it only initialises a new run)",
                      self.restored, init.checkpoint)
      return "", {}
    parts = self._parts
    return init_checkpoint.warm_start(init, parts.main_model, parts.main_optimizer, parts.strategy,
                                      self._twin)

  def _reset_learning_rates(self):
    """This run's learning rates over the restored ones."""
    for name, optimizer in self._parts.optimizers.items():
      optimizers_lib.set_constant_learning_rate(optimizer, self._parts.learning_rates[name])

  def save(self, step, wait=False):
    """Saves at `step` into workdir/checkpoints (asynchronously when enabled, unless `wait`); the path or None."""
    return self.series.save(step, wait=wait)

  def save_on_error(self, state):
    """Loop.on_error: when a callback or an eval raises after steps were trained, saves them first (for one
    process only: a save of several workers is collective, and the others may not be raising)."""
    unsaved = state.step - max(state.start_step, self.last_saved_step or 0)
    if unsaved <= 0:
      return
    try:
      path = self.save(state.step, wait=True)
    except Exception as e:  # pylint: disable=broad-except  # the error that stops the run is the one to report
      logging.warning("could not save the steps trained since the last checkpoint: %s", e)
      return
    logging.warning("the run stops on an error: the %d steps trained since the last checkpoint are saved in %s",
                    unsaved, path)

  def latest(self):
    return self.series.latest()

  def save_options(self):
    return self.series.save_options()

  def wait(self):
    self.series.wait()

  def close(self):
    """Waits for pending writes, then removes the scratch directories (a non-chief's)."""
    try:
      self.series.close()
    finally:
      if self.best:
        self.best.close()


class Series:
  """One directory's checkpoints. Every process saves (saves may involve collectives); only the chief's series lands
  in the workdir.

  Non-chief processes write to a private temporary directory (scratch_directory, one checkpoint kept: nobody reads it)
  that `close()` removes.

  With `async_save`, `save(step)` copies the variables to host memory and returns; TensorFlow's writer thread
  writes the files, then names the checkpoint in the index (so the index only ever names complete checkpoints).
  `save(step, wait=True)`, `latest()`, `restore_latest()` and `close()` first wait for pending writes.
  """

  def __init__(self, workdir, checkpoint, step_counter, keep, is_chief, subdir="checkpoints", async_save=False):
    self.directory = os.path.join(workdir, subdir)
    # The one chief-vs-worker decision of saving: the chief writes the series, the others a throw-away copy.
    self._writes_series = is_chief
    self._temporary = None if is_chief else scratch_directory()
    self._checkpoint, self._step_counter = checkpoint, step_counter
    self._keep = keep if is_chief else 1
    self._manager = self._make_manager()
    self._manager_handed_out = False  # once another object holds the manager, it is never replaced
    self.last_saved_step = None
    self.async_save = async_save
    if async_save:
      async_saves.keras_variables_reuse_their_host_copy()

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
    self.wait()
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
      _restore(self._checkpoint, path)
      logging.info("restored %s", path)
      if damaged and self._writes_series and not self._manager_handed_out:
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
    """The latest complete checkpoint (after pending writes), or None."""
    self.wait()
    return tf.train.latest_checkpoint(self.directory)

  def save(self, step, wait=False):
    """Saves at `step`: asynchronously when enabled, unless `wait` (then complete on return, after any pending
    write). Returns the path (None on non-chief processes)."""
    options = None if wait else self.save_options()
    if wait or options:
      self.wait()  # (TensorFlow's writer would wait for the previous write too: this costs nothing more)
    if options:
      self._align_async_save_counter()
    path = self._manager.save(checkpoint_number=step, options=options)
    self.last_saved_step = step
    if not self._writes_series:
      return None
    if options is None:
      logging.info("saved checkpoint %s", path)
    return path

  def save_options(self):
    """CheckpointOptions for an asynchronous save, or None. Its writer logs "saved checkpoint" once the index
    names the checkpoint (the line means what it says in both modes)."""
    if not self.async_save:
      return None
    log = (lambda path: logging.info("saved checkpoint %s", path)) if self._writes_series else (lambda: None)
    return tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True,
                                      experimental_write_callbacks=async_saves.LastStaysLast([log]))

  def _align_async_save_counter(self):
    """TensorFlow's writer saves through a tf.train.Checkpoint of its own, whose save_counter nothing increments;
    it is set to the number the manager is about to give this save, so asynchronous checkpoints hold the same
    save_counter as blocking ones (resumed runs end bit-identical). Called after wait(): the writer is idle."""
    writer = private_apis.async_writer(self._checkpoint, create=True)
    writer.checkpointer().save_counter.assign(self._checkpoint.save_counter + 1)

  def wait(self):
    """Blocks until every pending asynchronous write is on disk and in the index; raises its error if one failed."""
    if not self.async_save:
      return
    self._checkpoint.sync()
    writer = private_apis.async_writer(self._checkpoint)  # no public way to see a write's error
    if writer is not None:
      private_apis.raise_async_write_error(writer)

  def close(self):
    """Waits for pending writes (the process never exits with one half done), then removes the scratch directory."""
    try:
      self.wait()
    finally:
      if self._temporary:
        shutil.rmtree(self._temporary, ignore_errors=True)


def _restore(checkpoint, path):
  """Restores `checkpoint` (tf.train.Checkpoint) from `path`, every saved value matched to an object of this run;
  a checkpoint of another model or shape raises ConfigError, and nothing is restored in part.

  Callbacks' own state (checkpoint.callbacks, `attach`) is restored where `path` holds it and
  otherwise left as it is: a callback may be new to a resumed run, or a checkpoint older than it."""
  callback_states = getattr(checkpoint, "callbacks", None)
  if callback_states is None:
    return _restore_matched(checkpoint, path)
  _pending(callback_states).clear()  # values an earlier restore left for callbacks that never came: superseded
  del checkpoint.callbacks  # out of the match below
  try:
    _restore_matched(checkpoint, path)
  except ConfigError:
    _pending(checkpoint).pop("callbacks", None)  # nothing from a refused checkpoint
    checkpoint.callbacks = callback_states
    raise
  try:
    checkpoint.callbacks = callback_states  # TF's deferred restoration assigns what `path` holds for them
  except (ValueError, tf.errors.OpError) as e:
    raise ConfigError(f"checkpoint {path}: a callback's saved state does not fit it (callbacks/...: "
                      f"{first_line(e)}); use a new --workdir or keep the callback as it was") from None


def _restore_matched(checkpoint, path):
  try:
    checkpoint.restore(path).assert_existing_objects_matched()
  except (AssertionError, ValueError, LookupError, tf.errors.OpError) as e:
    raise ConfigError(f"checkpoint {path} does not match this model/optimizer (another model or shape?): "
                      f"{first_line(e)}; use a new --workdir") from None


def _pending(trackable):
  """TF's {name: [restore positions]} a trackable keeps for dependencies not attached yet (no public accessor)."""
  return private_apis.pending_restores(trackable)


def scratch_directory(root=None):
  """A new private temporary directory for a non-chief process's saves, named by host and pid. Those that dead
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


def steps_of(directory):
  """[(step, path)] of the checkpoints the directory's index lists, oldest first (CheckpointManager numbers them by
  step)."""
  return sorted((int(path.rsplit("-", 1)[1]), path) for path in index_paths(directory))


def saved_step(path):
  """The step counter saved in the checkpoint at `path` (its name may be anything), or None without one."""
  try:
    return int(tf.train.load_checkpoint(path).get_tensor("step" + _VALUE))
  except (tf.errors.OpError, ValueError):
    return None


_BOOKKEEPING = ("save_counter/", "_CHECKPOINTABLE_OBJECT_GRAPH")


def same_values(first, second):
  """Whether the checkpoints at `first` and `second` hold the same variables with bit-identical values (a best
  checkpoint and the periodic one of its step; their save counters and object graphs aside); False when either
  cannot be read."""
  try:
    readers = [tf.train.load_checkpoint(path) for path in (first, second)]
    names = [{name for name in reader.get_variable_to_dtype_map() if not name.startswith(_BOOKKEEPING)}
             for reader in readers]
    return names[0] == names[1] and all(
        np.array_equal(readers[0].get_tensor(name), readers[1].get_tensor(name)) for name in names[0])
  except (tf.errors.OpError, ValueError):
    return False


def unreadable(path):
  """Why the checkpoint at `path` cannot be read back (missing file, size or checksum error), or None.

  Reads every tensor (TensorBundle verifies each one's checksum), so a restore never starts on a torn checkpoint.
  """
  try:
    reader = tf.compat.v1.train.NewCheckpointReader(path)  # load_checkpoint takes ram://.../ckpt-N for a directory
    for name in reader.get_variable_to_dtype_map():
      reader.get_tensor(name)
  except (tf.errors.OpError, IndexError, ValueError) as e:
    return described(e)
  return None


def callbacks_node():
  """The checkpoint's callbacks/ node, made with the checkpoint (TF's asynchronous writer saves what a checkpoint
  was constructed with, not what is attached to it later)."""
  return tf.Module(name="callbacks")


def attach(checkpoint, built_ins, users, restored=None):
  """Puts every callback's `checkpointed` (a tf.Module or a dict of tf.Variables) into `checkpoint.callbacks`
  (call after its restore); TF's deferred restoration then assigns what `restored` holds for it, and a callback new
  to a resumed run starts afresh (`_restore` never requires it).

  Keys: a built-in callback's `state_key` ("early_stopping", "checkpointing"); a user callback's
  <index among the user callbacks>_<class name>.
  """
  states = {c.state_key: c.checkpointed for c in built_ins if getattr(c, "checkpointed", None) is not None}
  states.update({f"{index}_{type(c).__name__}": c.checkpointed for index, c in enumerate(users)
                 if getattr(c, "checkpointed", None) is not None})
  if restored:
    _check_against_checkpoint(restored, states)
  for key, state in states.items():
    setattr(checkpoint.callbacks, key, state)


def _check_against_checkpoint(path, states):
  """ConfigError when a callback's state variable has another shape or dtype than the checkpoint holds for it (TF
  would fail naming only 'Variable:0', or with a RestoreV2 traceback)."""
  reader = tf.compat.v1.train.NewCheckpointReader(path)
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  for key, state in states.items():
    for name, variable in _named_variables(state):
      saved = f"callbacks/{key}/{name}{_VALUE}"
      if saved not in shapes:
        continue
      now, before = (variable.dtype.name, list(variable.shape)), (dtypes[saved].name, list(shapes[saved]))
      if now != before:
        owner = key.split('_', 1)[1] if key[0].isdigit() else key
        raise ConfigError(f"callback {owner}: its checkpointed '{name}' is {now[0]} {now[1]} here "
                          f"but {before[0]} {before[1]} in {path}: keep its dtype and shape, or give the new one "
                          "another name (a name new to the checkpoint starts afresh)")


def _named_variables(state):
  """(checkpoint name, tf.Variable) of a callback's state: a dict's entries, a tf.Module's variable attributes."""
  items = state.items() if isinstance(state, dict) else vars(state).items()
  return [(name, value) for name, value in items if isinstance(value, tf.Variable)]
