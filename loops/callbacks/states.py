"""Callbacks' own checkpointed state: each callback's `checkpointed` (a tf.Module or a dict of tf.Variables) joins
the run's checkpoint under callbacks/<key> after the restore; TF's deferred restoration then assigns what the
checkpoint holds for it, and a callback new to a resumed run starts afresh (loops/persist/checkpoints.restore never
requires it).

Keys: a built-in callback's `state_key` ("early_stopping", "checkpointing"); a user callback's
<index among the user callbacks>_<class name>.
"""

import tensorflow as tf

from errors import ConfigError

# Checkpoints written before the built-in callbacks kept their own state held it in one module under run/.
LEGACY = {
    ("checkpointing", "stopped_total_steps"): "run/stopped_total_steps",
    ("early_stopping", "best"): "run/early_stopping_best",
    ("early_stopping", "best_step"): "run/early_stopping_best_step",
    ("early_stopping", "evals_since"): "run/early_stopping_evals_since",
}
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def container():
  """The checkpoint's callbacks/ node: pass it to tf.train.Checkpoint(callbacks=...) as the checkpoint is made
  (TF's asynchronous writer saves what the checkpoint was constructed with, not what is attached to it later)."""
  return tf.Module(name="callbacks")


def attach(checkpoint, built_ins, users, restored=None):
  """Puts every callback's state into `checkpoint.callbacks` (call after its restore); `restored`: the path it
  restored, whose pre-callback-state values (run/...) are read into the built-ins' state when it holds no newer
  ones."""
  states = {c.state_key: c.checkpointed for c in built_ins if getattr(c, "checkpointed", None) is not None}
  states.update({f"{index}_{type(c).__name__}": c.checkpointed for index, c in enumerate(users)
                 if getattr(c, "checkpointed", None) is not None})
  if restored:
    _check_against_checkpoint(restored, states)
  for key, state in states.items():
    setattr(checkpoint.callbacks, key, state)
  if restored and states:
    _read_legacy(restored, {key: getattr(checkpoint.callbacks, key) for key in states})


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


def _read_legacy(path, states):
  reader = tf.compat.v1.train.NewCheckpointReader(path)  # load_checkpoint takes ram://.../ckpt-N for a directory
  saved = reader.get_variable_to_shape_map()
  for (key, name), old in LEGACY.items():
    if key in states and old + _VALUE in saved and f"callbacks/{key}/{name}{_VALUE}" not in saved:
      states[key][name].assign(reader.get_tensor(old + _VALUE))
